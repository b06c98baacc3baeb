"""Embedded `AuditStore`: the audit log of admin changes in SQLite, one row per change, read
newest first (by time, then by the order of insertion); records older than RETENTION_DAYS are
deleted as new ones are appended (the first append of a process, then every PRUNE_EVERY)."""

from __future__ import annotations

from pathlib import Path

from services.common.clock import now_ms
from services.common.store.audit_log import DAY_MS, RETENTION_DAYS, AuditRecord
from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, record_id TEXT NOT NULL, at_ms INTEGER NOT NULL,
  actor TEXT NOT NULL, tenant TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
  detail TEXT NOT NULL, address TEXT NOT NULL, outcome TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_by_tenant ON audit (tenant, at_ms);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (at_ms);
"""
_COLUMNS = "at_ms, actor, tenant, action, target, detail, address, outcome, record_id"
PRUNE_EVERY = 256  # appends between two deletions of records older than RETENTION_DAYS


class SqliteAuditStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)
        self._appends = 0

    async def append(self, r: AuditRecord) -> None:
        self._appends += 1
        if self._appends % PRUNE_EVERY == 1:
            cutoff = r.at_ms - RETENTION_DAYS * DAY_MS
            await self.run(lambda: self.db.execute("DELETE FROM audit WHERE at_ms < ?", (cutoff,)))
        await self.run(
            lambda: self.db.execute(
                f"INSERT INTO audit ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r.at_ms,
                    r.actor,
                    r.tenant,
                    r.action,
                    r.target,
                    r.detail,
                    r.address,
                    r.outcome,
                    r.record_id,
                ),
            )
        )

    async def recent(self, tenant: str | None, limit: int) -> list[AuditRecord]:
        since = now_ms() - RETENTION_DAYS * DAY_MS

        def q() -> list[tuple[int, str, str, str, str, str, str, str, str]]:
            order = "ORDER BY at_ms DESC, seq DESC LIMIT ?"
            if tenant is None:
                return self.db.execute(
                    f"SELECT {_COLUMNS} FROM audit WHERE at_ms >= ? {order}", (since, limit)
                ).fetchall()
            return self.db.execute(
                f"SELECT {_COLUMNS} FROM audit WHERE tenant=? AND at_ms >= ? {order}",
                (tenant, since, limit),
            ).fetchall()

        return [_record(row) for row in await self.run(q)]


def _record(row: tuple[int, str, str, str, str, str, str, str, str]) -> AuditRecord:
    at_ms, actor, tenant, action, target, detail, address, outcome, record_id = row
    return AuditRecord(
        at_ms=at_ms,
        actor=actor,
        tenant=tenant,
        action=action,
        target=target,
        detail=detail,
        address=address,
        outcome=outcome,
        record_id=record_id,
    )
