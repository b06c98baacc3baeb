"""Cassandra `AuditStore`: the console's audit log of admin changes.

Rows are partitioned by (scope, UTC day): each record is written twice, once under its
tenant's scope and once under the cluster scope "*", so an operator's view and a tenant's
view each read a few day partitions. A day of one scope stays small (the log records changes
people make, not traffic), so a read takes a whole day partition and orders it newest first
itself; it walks back day by day until it has `limit` rows or has read `MAX_DAYS` days.
"""

from __future__ import annotations

from services.common.clock import now_ms
from services.common.store.audit_log import DAY_MS, RETENTION_DAYS, AuditRecord
from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration

MAX_DAYS = RETENTION_DAYS
ALL = "*"
_COLUMNS = "at_ms, record_id, actor, tenant, action, target, detail, address, outcome"

MIGRATIONS = [
    Migration(
        1,
        "console audit log",
        (
            """CREATE TABLE IF NOT EXISTS audit (
             scope text, day bigint, at_ms bigint, record_id text, actor text, tenant text,
             action text, target text, detail text, address text, outcome text,
             PRIMARY KEY ((scope, day), at_ms, record_id))""",
        ),
    )
]
TTL_S = RETENTION_DAYS * DAY_MS // 1000  # each record expires when reads stop looking for it


class CassandraAuditStore(CassandraBase):
    component = "audit"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._put = p(
            f"INSERT INTO audit (scope, day, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            f" USING TTL {TTL_S}"
        )
        self._day = p(f"SELECT {_COLUMNS} FROM audit WHERE scope=? AND day=?")

    async def append(self, r: AuditRecord) -> None:
        day = r.at_ms // DAY_MS
        values = (
            r.at_ms,
            r.record_id,
            r.actor,
            r.tenant,
            r.action,
            r.target,
            r.detail,
            r.address,
            r.outcome,
        )
        for scope in {ALL, r.tenant}:
            await self._exec(self._put, (scope, day, *values))

    async def recent(self, tenant: str | None, limit: int) -> list[AuditRecord]:
        scope = ALL if tenant is None else tenant
        day = now_ms() // DAY_MS
        out: list[AuditRecord] = []
        for back in range(MAX_DAYS):
            rows = [_record(row) for row in await self._exec(self._day, (scope, day - back))]
            rows.sort(key=lambda r: (r.at_ms, r.record_id), reverse=True)
            out.extend(rows[: limit - len(out)])
            if len(out) >= limit:
                break
        return out


def _record(row: object) -> AuditRecord:
    return AuditRecord(
        at_ms=row.at_ms,  # type: ignore[attr-defined]
        record_id=row.record_id,  # type: ignore[attr-defined]
        actor=row.actor or "",  # type: ignore[attr-defined]
        tenant=row.tenant or "",  # type: ignore[attr-defined]
        action=row.action or "",  # type: ignore[attr-defined]
        target=row.target or "",  # type: ignore[attr-defined]
        detail=row.detail or "",  # type: ignore[attr-defined]
        address=row.address or "",  # type: ignore[attr-defined]
        outcome=row.outcome or "",  # type: ignore[attr-defined]
    )
