"""Embedded `RouterStore`: retained messages and delayed publishes in SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from services.common.store.ports_router import DelayedRecord, RetainedRecord
from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
  tenant TEXT NOT NULL, topic TEXT NOT NULL, data BLOB NOT NULL,
  expires_at_ms INTEGER NOT NULL, PRIMARY KEY (tenant, topic));
CREATE TABLE IF NOT EXISTS delayed (
  tenant TEXT NOT NULL, id TEXT NOT NULL, due_ms INTEGER NOT NULL, data BLOB NOT NULL,
  PRIMARY KEY (tenant, id));
"""


class SqliteRouterStore(SqliteDb):
    def __init__(self, path: Path, sync: str = "full") -> None:
        super().__init__(path, _SCHEMA, sync)

    async def put_retained(self, r: RetainedRecord) -> None:
        await self.run(
            lambda: self.db.execute(
                "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?)",
                (r.tenant, r.topic, r.data, r.expires_at_ms),
            )
        )

    async def delete_retained(self, tenant: str, topic: str) -> bool:
        cur = await self.run(
            lambda: self.db.execute(
                "DELETE FROM retained WHERE tenant=? AND topic=?", (tenant, topic)
            )
        )
        return cur.rowcount > 0

    async def all_retained(self) -> list[RetainedRecord]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT tenant, topic, data, expires_at_ms FROM retained"
            ).fetchall()
        )
        return [RetainedRecord(t, top, d, e) for t, top, d, e in rows]

    async def tenant_retained(self, tenant: str) -> list[RetainedRecord]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT topic, data, expires_at_ms FROM retained WHERE tenant = ?", (tenant,)
            ).fetchall()
        )
        return [RetainedRecord(tenant, top, d, e) for top, d, e in rows]

    async def put_delayed(self, r: DelayedRecord) -> None:
        await self.run(
            lambda: self.db.execute(
                "INSERT OR REPLACE INTO delayed VALUES (?, ?, ?, ?)",
                (r.tenant, r.id, r.due_ms, r.data),
            )
        )

    async def delete_delayed(self, tenant: str, id: str) -> bool:
        cur = await self.run(
            lambda: self.db.execute("DELETE FROM delayed WHERE tenant=? AND id=?", (tenant, id))
        )
        return cur.rowcount > 0

    async def all_delayed(self) -> list[DelayedRecord]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT id, tenant, due_ms, data FROM delayed ORDER BY due_ms"
            ).fetchall()
        )
        return [DelayedRecord(i, t, d, data) for i, t, d, data in rows]


# ---- Compaction (analytics/jobs/queue_compaction.py) ---------------------------------------


def compact_retained(db: sqlite3.Connection, tenant: str, topic: str, now_ms: int) -> bool:
    """Delete the topic's retained message if it has expired (0: never), re-checked now: a
    message retained since the job looked replaces the row and stays."""
    return (
        db.execute(
            "DELETE FROM retained WHERE tenant=? AND topic=? AND expires_at_ms>0 "
            "AND expires_at_ms<?",
            (tenant, topic, now_ms),
        ).rowcount
        > 0
    )
