"""The audit log's record and storage port (the console appends, pages read): kept beside
the other store ports (services/common/store/ports_*.py), with an embedded (sqlite_audit.py)
and a Cassandra (cassandra_audit.py) adapter that pass the same contract tests
(tests/common/test_store_contract_audit.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# How long a record is kept: the embedded store deletes older ones as it appends, Cassandra
# lets them expire (a table TTL); reads never look further back.
RETENTION_DAYS = 90
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """One change made through the console (services/console/audit.py): who made it, on
    which tenant ("" for the whole cluster), what, when, from which address, and how it ended."""

    at_ms: int
    actor: str
    tenant: str
    action: str
    target: str = ""
    detail: str = ""
    address: str = ""
    outcome: str = "ok"
    record_id: str = ""  # unique; the store's order among records of the same millisecond


class AuditStore(Protocol):
    """The audit log of admin changes, appended by the console, read newest first."""

    async def append(self, record: AuditRecord) -> None: ...

    async def recent(self, tenant: str | None, limit: int) -> list[AuditRecord]:
        """The newest `limit` records, newest first: every tenant's (None) or one tenant's."""

    async def close(self) -> None: ...
