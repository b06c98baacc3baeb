"""Cassandra `AdminTokenStore`: one row per token keyed by its id (a lookup is one partition
read); listing scans the table, which holds a handful of rows per tenant.

Only plain writes, never a lightweight transaction (a plain write and an LWT on one row are
ordered by different clocks): a delete reads the row (LOCAL_QUORUM) to say whether it was
there, then deletes it."""

from __future__ import annotations

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration
from services.common.store.ports_auth import AdminTokenRecord

_COLUMNS = "token_id, tenant, token_hash, created_at_ms, expires_at_ms, description"


MIGRATIONS = [
    Migration(
        1,
        "admin tokens",
        (
            """CREATE TABLE IF NOT EXISTS admin_tokens (
             token_id text PRIMARY KEY, tenant text, token_hash text,
             created_at_ms bigint, expires_at_ms bigint, description text)""",
        ),
    )
]


class CassandraTokenStore(CassandraBase):
    component = "tokens"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._put = p(f"INSERT INTO admin_tokens ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)")
        self._get = p(f"SELECT {_COLUMNS} FROM admin_tokens WHERE token_id=?")
        self._all = p(f"SELECT {_COLUMNS} FROM admin_tokens")
        self._del = p("DELETE FROM admin_tokens WHERE token_id=?")

    async def put_token(self, r: AdminTokenRecord) -> None:
        await self._exec(
            self._put,
            (r.token_id, r.tenant, r.token_hash, r.created_at_ms, r.expires_at_ms, r.description),
        )

    async def get_token(self, token_id: str) -> AdminTokenRecord | None:
        rows = list(await self._exec(self._get, (token_id,)))
        return _record(rows[0]) if rows else None

    async def list_tokens(self, tenant: str | None = None) -> list[AdminTokenRecord]:
        rows = [_record(r) for r in await self._exec(self._all)]
        mine = [r for r in rows if tenant is None or r.tenant == tenant]
        return sorted(mine, key=lambda r: (r.created_at_ms, r.token_id))

    async def delete_token(self, token_id: str) -> bool:
        if not await self._exec(self._get, (token_id,)):
            return False
        await self._exec(self._del, (token_id,))
        return True


def _record(row: object) -> AdminTokenRecord:
    return AdminTokenRecord(
        token_id=row.token_id,  # type: ignore[attr-defined]
        tenant=row.tenant,  # type: ignore[attr-defined]
        token_hash=row.token_hash,  # type: ignore[attr-defined]
        created_at_ms=row.created_at_ms,  # type: ignore[attr-defined]
        expires_at_ms=row.expires_at_ms or 0,  # type: ignore[attr-defined]
        description=row.description or "",  # type: ignore[attr-defined]
    )
