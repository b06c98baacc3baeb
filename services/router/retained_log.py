"""A `RouterStore` whose retained-message writes are also recorded in the event log.

The retained rows live in the router's store and the log in the sessions store (two files in
the embedded store, so not one transaction): the log row is written after the retained write
succeeded. A router that dies between the two leaves that one change out of the log; the log
is a record for reports here, never what retained messages are restored from.
"""

from __future__ import annotations

from services.common.store.eventlog import EventKind, EventLog, LogEvent
from services.common.store.ports_router import DelayedRecord, RetainedRecord, RouterStore


class RetainedLogging:
    """`RouterStore` around `inner`, logging RETAINED_SET and RETAINED_CLEARED."""

    def __init__(self, inner: RouterStore, log: EventLog) -> None:
        self._inner = inner
        self._log = log

    async def put_retained(self, rec: RetainedRecord) -> None:
        await self._inner.put_retained(rec)
        # options: the stored size, what a tenant report sums up.
        ev = LogEvent(rec.tenant, EventKind.RETAINED_SET, topic=rec.topic, options=len(rec.data))
        await self._log.append_events([ev])

    async def delete_retained(self, tenant: str, topic: str) -> bool:
        deleted = await self._inner.delete_retained(tenant, topic)
        if deleted:
            await self._log.append_events(
                [LogEvent(tenant, EventKind.RETAINED_CLEARED, topic=topic)]
            )
        return deleted

    async def all_retained(self) -> list[RetainedRecord]:
        return await self._inner.all_retained()

    async def tenant_retained(self, tenant: str) -> list[RetainedRecord]:
        return await self._inner.tenant_retained(tenant)

    async def put_delayed(self, rec: DelayedRecord) -> None:
        await self._inner.put_delayed(rec)

    async def delete_delayed(self, tenant: str, id: str) -> bool:
        return await self._inner.delete_delayed(tenant, id)

    async def all_delayed(self) -> list[DelayedRecord]:
        return await self._inner.all_delayed()

    async def close(self) -> None:
        await self._inner.close()
