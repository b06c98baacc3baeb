"""Persistent session state: records in the store, cleanup of ended sessions, expiry.

The session service owns session records; the router owns their subscriptions and the queue
service their queues, so ending a session asks both to forget that incarnation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from services.common.store.ports import SessionRecord, SessionStore
from services.queue.client import QueueClient, queue_id
from services.router.client import RouterClient
from services.session.core import decide
from services.session.events import Events
from starling.session.v1 import session_pb2 as pb

log = logging.getLogger("starling.session")


@dataclass(slots=True)
class Opened:
    present: bool
    incarnation: int
    expiry_s: int
    subscriptions: list[pb.StoredSubscription] = field(default_factory=list)


class Sessions:
    def __init__(
        self,
        store: SessionStore,
        router: RouterClient,
        queues: QueueClient,
        max_expiry_s: int,
        events: Events,
    ) -> None:
        self._store = store
        self._router = router
        self._queues = queues
        self._max_expiry = max_expiry_s
        self._events = events
        self._tasks: set[asyncio.Task[None]] = set()

    async def open(self, tenant: str, client_id: str, clean_start: bool, expiry_s: int) -> Opened:
        expiry_s = min(expiry_s, self._max_expiry)
        rec = await self._store.get_session(tenant, client_id)
        d = decide(rec, clean_start, expiry_s, time.time_ns() // 1000)
        if d.discard is not None:
            self._spawn(self._discard(d.discard))
        if d.persist or d.present:
            await self._store.put_session(
                SessionRecord(tenant, client_id, d.incarnation, expiry_s, True)
            )
        subs: list[pb.StoredSubscription] = []
        if d.present:
            for s in await self._store.list_subscriptions(tenant, client_id, d.incarnation):
                subs.append(
                    pb.StoredSubscription(
                        topic_filter=s.topic_filter,
                        qos=s.qos,
                        no_local=s.no_local,
                        retain_as_published=s.retain_as_published,
                        retain_handling=s.retain_handling,
                        subscription_identifier=s.subscription_identifier,
                    )
                )
        return Opened(d.present, d.incarnation, expiry_s, subs)

    async def close(
        self, tenant: str, client_id: str, incarnation: int, expiry_s: int | None
    ) -> None:
        rec = await self._store.get_session(tenant, client_id)
        if rec is None or rec.incarnation != incarnation:
            return
        expiry = rec.expiry_interval_s if expiry_s is None else min(expiry_s, self._max_expiry)
        if expiry == 0:
            await self._discard(rec)
            return
        await self._store.put_session(
            SessionRecord(tenant, client_id, incarnation, expiry, False, int(time.time() * 1000))
        )

    async def park(self, tenant: str, client_id: str, at_ms: int) -> None:
        """The node holding the client died: the session is disconnected since `at_ms`."""
        rec = await self._store.get_session(tenant, client_id)
        if rec is None or not rec.connected:
            return
        if rec.expiry_interval_s == 0:
            await self._discard(rec)
            return
        await self._store.put_session(
            SessionRecord(tenant, client_id, rec.incarnation, rec.expiry_interval_s, False, at_ms)
        )

    async def _discard(self, rec: SessionRecord) -> None:
        """End a session incarnation: forget its subscriptions, its queue, its record."""
        try:
            await self._router.drop_session(rec.tenant, rec.client_id, rec.incarnation)
            await self._queues.drop(rec.tenant, queue_id(rec.client_id, rec.incarnation))
        except Exception as exc:  # retried by the expiry sweep while the record remains
            log.warning("session_discard_failed", extra={"error": str(exc)})
            return
        await self._store.delete_session(rec.tenant, rec.client_id, rec.incarnation)

    async def sweep(self) -> int:
        """End every session whose expiry has passed; works with no node up."""
        expired = await self._store.expired_sessions(int(time.time() * 1000))
        for rec in expired:
            await self._discard(rec)
            await self._events.emit(rec.tenant, rec.client_id, "session_expired")
            log.info("session_expired", extra={"tenant": rec.tenant, "client_id": rec.client_id})
        return len(expired)

    async def run_sweeper(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.sweep()
            except Exception:  # keep sweeping; one bad pass must not stop expiry
                log.exception("session_sweep_failed")

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
