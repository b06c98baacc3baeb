"""Embedded `AdminTokenStore`: tenant-scoped admin tokens (hashes only) in SQLite."""

from __future__ import annotations

from pathlib import Path

from services.common.store.ports_auth import AdminTokenRecord
from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS admin_tokens (
  token_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, token_hash TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, description TEXT NOT NULL);
"""
_COLUMNS = "token_id, tenant, token_hash, created_at_ms, expires_at_ms, description"


class SqliteTokenStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)

    async def put_token(self, r: AdminTokenRecord) -> None:
        await self.run(
            lambda: self.db.execute(
                "INSERT OR REPLACE INTO admin_tokens VALUES (?, ?, ?, ?, ?, ?)",
                (
                    r.token_id,
                    r.tenant,
                    r.token_hash,
                    r.created_at_ms,
                    r.expires_at_ms,
                    r.description,
                ),
            )
        )

    async def get_token(self, token_id: str) -> AdminTokenRecord | None:
        row = await self.run(
            lambda: self.db.execute(
                f"SELECT {_COLUMNS} FROM admin_tokens WHERE token_id=?", (token_id,)
            ).fetchone()
        )
        return AdminTokenRecord(*row) if row else None

    async def list_tokens(self, tenant: str | None = None) -> list[AdminTokenRecord]:
        def q() -> list[tuple[str, str, str, int, int, str]]:
            sql = f"SELECT {_COLUMNS} FROM admin_tokens"
            if tenant is None:
                return self.db.execute(f"{sql} ORDER BY created_at_ms, token_id").fetchall()
            return self.db.execute(
                f"{sql} WHERE tenant=? ORDER BY created_at_ms, token_id", (tenant,)
            ).fetchall()

        return [AdminTokenRecord(*row) for row in await self.run(q)]

    async def delete_token(self, token_id: str) -> bool:
        cur = await self.run(
            lambda: self.db.execute("DELETE FROM admin_tokens WHERE token_id=?", (token_id,))
        )
        return cur.rowcount > 0
