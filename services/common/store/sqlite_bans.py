"""Embedded `BanStore`: the ban list in a SQLite file under the data dir (Redis is not used,
so a Redis flush loses no ban). Quota instances of one machine share the file; across hosts
the list lives in Cassandra (cassandra_bans.py). Expired bans are removed as they are found.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from services.common.bans import Ban, BanKind
from services.common.clock import now_ms
from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bans (
  kind INTEGER NOT NULL,
  tenant TEXT NOT NULL,
  value TEXT NOT NULL,
  reason TEXT NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  source TEXT NOT NULL,
  PRIMARY KEY (kind, tenant, value)
);
"""


class SqliteBanStore:
    def __init__(self, path: Path) -> None:
        self._db = SqliteDb(path, _SCHEMA)

    async def put(self, ban: Ban, max_bans: int) -> bool:
        """Add or replace `ban`; False (nothing written) when `max_bans` bans are in force
        and this one is new."""

        def put(db: sqlite3.Connection) -> bool:
            db.execute(
                "DELETE FROM bans WHERE expires_at_ms > 0 AND expires_at_ms <= ?", (now_ms(),)
            )
            exists = db.execute(
                "SELECT 1 FROM bans WHERE kind = ? AND tenant = ? AND value = ?", ban.key
            ).fetchone()
            if not exists and max_bans:
                (n,) = db.execute("SELECT COUNT(*) FROM bans").fetchone()
                if n >= max_bans:
                    return False
            db.execute(
                "INSERT OR REPLACE INTO bans VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    int(ban.kind),
                    ban.tenant,
                    ban.value,
                    ban.reason,
                    ban.expires_at_ms,
                    ban.created_at_ms,
                    ban.source,
                ),
            )
            return True

        # One transaction: two instances on the file cannot both take the last free place.
        return await self._db.run(lambda: self._db.tx(put))

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        def run() -> bool:
            cur = self._db.db.execute(
                "DELETE FROM bans WHERE kind = ? AND tenant = ? AND value = ?",
                (int(kind), tenant, value),
            )
            return cur.rowcount > 0

        return await self._db.run(run)

    async def list(self) -> list[Ban]:
        """Every ban in force, oldest first."""

        def run() -> list[Ban]:
            rows = self._db.db.execute(
                "SELECT kind, tenant, value, reason, expires_at_ms, created_at_ms, source "
                "FROM bans WHERE expires_at_ms = 0 OR expires_at_ms > ? ORDER BY created_at_ms",
                (now_ms(),),
            ).fetchall()
            return [
                Ban(
                    kind=BanKind(k),
                    tenant=t,
                    value=v,
                    reason=r,
                    expires_at_ms=e,
                    created_at_ms=c,
                    source=s,
                )
                for k, t, v, r, e, c, s in rows
            ]

        return await self._db.run(run)

    async def close(self) -> None:
        await self._db.close()
