"""The console's audit log: every change made through it (who, what, on which tenant, when,
from which address, and how it ended) appended to the store's audit table
(services/common/store/audit_log.py `AuditStore`), shown at /audit."""

from __future__ import annotations

import logging
import uuid

from services.common.store.audit_log import AuditRecord, AuditStore
from services.console.signin import Principal, now_ms

log = logging.getLogger("starling.console.audit")


class Auditor:
    def __init__(self, store: AuditStore) -> None:
        self._store = store

    async def record(
        self,
        principal: Principal,
        *,
        tenant: str,
        action: str,
        target: str = "",
        detail: str = "",
        address: str = "",
        outcome: str = "ok",
    ) -> None:
        rec = AuditRecord(
            at_ms=now_ms(),
            actor=principal.name,
            tenant=tenant,
            action=action,
            target=target,
            detail=detail,
            address=address,
            outcome=outcome,
            record_id=uuid.uuid4().hex,
        )
        log.info(
            "console_change",
            extra={"actor": rec.actor, "tenant": tenant, "action": action, "outcome": outcome},
        )
        await self._store.append(rec)

    async def recent(self, tenant: str | None, limit: int) -> list[AuditRecord]:
        return await self._store.recent(tenant, limit)
