"""Delayed messages: `$delayed/{seconds}/{topic}` publishes and delayed wills, held until due
(`DelayedMessages`) and then published (`DelayScheduler`).

Invariants:
- A record is in the store before it is held in memory, so it survives a restart of every
  service (`load` reads them all back; the tenants' usage follows from them).
- A due record is published, then deleted from the store, then forgotten. A failure (or a
  crash) in between publishes it again; a persistent queue drops the repeat by message id.
- A delayed will (id `will/<client id>`, one per client) replaces the one held before and
  never counts against the tenant's delayed caps: a cap must never lose a will. A will that
  replaces one being published is not deleted with it.
- The scheduler outlives errors: a round that fails is logged and the next one runs; a
  record whose publish or delete failed fires again `RETRY_MS` later.
- Several instances (services/router/cluster.py): the held records are made the store's
  again when another instance wrote since (`Generations`), and only the holder of the
  scheduler lease fires.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client

from services.common.bus.large import Holder
from services.common.bus.publisher import RulesFeed
from services.common.clock import now_ms
from services.common.route_table import RouteResult
from services.common.store.ports_router import DelayedRecord, RouterStore
from services.common.topics import topic_to_subject
from services.common.topics.delayed import DelayedTopic
from services.router.cluster import DELAYED, Generations, Lease
from services.router.delayed import Schedule
from services.router.limits import Caps, Usage, fits
from services.router.quota_events import QuotaEvents
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

log = logging.getLogger("starling.router")
WILL_PREFIX = "will/"
RETRY_MS = 1000  # a record whose publish or delete failed fires again this much later
TURN_S = 0.2  # the scheduler looks for due records at least this often

# What a due message goes through as a publish: the router's `Publisher.accept`.
Route = Callable[[list[RoutedMessage]], Awaitable[tuple[list[RouteResult], int]]]


def will_id(client_id: str) -> str:
    """Id of a client's delayed will among the delayed messages (one per client)."""
    return WILL_PREFIX + client_id


class DelayedMessages:
    """The held delayed records, their due times and each tenant's usage. Call `load` once
    at start; `delay` and `delay_will` hold, `cancel` drops; the scheduler takes what is
    `due` and reports each one `done` or to `retry`."""

    def __init__(
        self,
        *,
        store: RouterStore,
        caps: Caps,
        quota: QuotaEvents,
        generations: Generations | None = None,
    ) -> None:
        self._store = store
        self._caps = caps
        self._quota = quota
        self._generations = generations  # several instances; None: this one is alone
        self._records: dict[tuple[str, str], DelayedRecord] = {}
        # Pending `$delayed` messages per tenant (delayed wills are not counted).
        self._usage = Usage()
        self._schedule = Schedule()
        self._wake = asyncio.Event()  # set when a record is held: its due time may be first

    def __len__(self) -> int:
        """Due times scheduled (one per record after `load`)."""
        return len(self._schedule)

    def count(self, tenant: str) -> int:
        """The tenant's `$delayed` messages held (wills are not counted)."""
        return self._usage.count(tenant)

    def get(self, tenant: str, id: str) -> DelayedRecord | None:
        return self._records.get((tenant, id))

    def of_tenant(self, tenant: str) -> list[DelayedRecord]:
        """The tenant's held records, soonest due first."""
        return sorted((r for (t, _), r in self._records.items() if t == tenant), key=_due)

    async def load(self) -> None:
        """Every delayed record of the store, held and scheduled."""
        g = await self._generations.stale(DELAYED) if self._generations else None
        self._records.clear()
        self._usage = Usage()
        self._schedule = Schedule()
        for d in await self._store.all_delayed():
            self._hold(d)
        if self._generations is not None and g is not None:
            self._generations.adopt(DELAYED, g)

    async def fresh(self) -> None:
        """Several instances: the held records are the store's (reloaded if another
        instance wrote since we looked)."""
        if self._generations is not None and await self._generations.stale(DELAYED) is not None:
            await self.load()

    async def delay(self, m: RoutedMessage, d: DelayedTopic, id: str = "") -> bool:
        """Hold `m` until due; False when the tenant's delayed caps refuse it. A `$delayed`
        message already held (the node retrying the same message id) is not held twice; a
        will (`id` given) replaces the client's will held before."""
        key = (m.tenant, id or m.message_id)
        await self.fresh()
        if not id and key in self._records:
            return True
        inner = RoutedMessage()
        inner.CopyFrom(m)
        inner.topic = d.topic
        rec = DelayedRecord(
            key[1], m.tenant, now_ms() + d.seconds * 1000, inner.SerializeToString()
        )
        if not id:
            limit = self._limit(m.tenant, len(rec.data))
            if limit:
                await self._quota.exceeded(m.tenant, limit)
                return False
        await self._store.put_delayed(rec)
        self._hold(rec)
        await self._wrote()
        self._wake.set()
        return True

    async def delay_will(self, m: RoutedMessage, delay_s: int) -> None:
        """A will with a delay: published when due unless the client comes back first."""
        await self.delay(m, DelayedTopic(delay_s, m.topic), will_id(m.publisher.client_id))

    async def cancel(self, tenant: str, id: str) -> bool:
        """Drop a held record; False when none was held."""
        await self.fresh()
        rec = self._unhold(tenant, id)
        if rec is None:
            return False
        self._schedule.cancel(tenant, id)
        await self._store.delete_delayed(tenant, id)
        await self._wrote()
        return True

    async def changed(self, timeout_s: float) -> None:
        """Wait up to `timeout_s`, less if a record is held meanwhile."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except TimeoutError:
            pass

    def next_due_ms(self) -> int | None:
        return self._schedule.next_due_ms()

    def due(self, now_ms: int) -> list[tuple[str, str]]:
        """The (tenant, id) of each record due at `now_ms`, taken off the schedule: one
        still held when its turn comes must end `done` or in `retry`."""
        return self._schedule.pop_due(now_ms)

    def retry(self, rec: DelayedRecord, at_ms: int) -> None:
        """Schedule a due record again (still held, it fires at `at_ms`)."""
        self._schedule.add(at_ms, rec.tenant, rec.id)

    async def done(self, rec: DelayedRecord) -> None:
        """A due record was published: deleted from the store, then forgotten (so it stays
        held when the delete fails). A will that replaced it meanwhile (the client came and
        went again while it was being published) stays, in memory and in the store."""
        key = (rec.tenant, rec.id)
        if self._records.get(key) is not rec:
            return  # replaced or cancelled while it was published
        await self._store.delete_delayed(rec.tenant, rec.id)
        current = self._records.get(key)
        if current is rec:
            self._unhold(rec.tenant, rec.id)
        elif current is not None:  # replaced during the delete: its write may have gone first
            await self._store.put_delayed(current)
        await self._wrote()

    def _limit(self, tenant: str, nbytes: int) -> str:
        """The delayed cap one more message of `nbytes` would break ("": none)."""
        u, caps = self._usage, self._caps
        if fits(u.count(tenant), u.size(tenant), 1, nbytes, caps.delayed_messages, 0):
            if fits(u.count(tenant), u.size(tenant), 1, nbytes, 0, caps.delayed_bytes):
                return ""
            return "delayed_bytes"
        return "delayed_messages"

    def _hold(self, rec: DelayedRecord) -> None:
        old = self._records.get((rec.tenant, rec.id))
        if old is not None:
            self._drop_usage(old)
        self._records[(rec.tenant, rec.id)] = rec
        if not rec.id.startswith(WILL_PREFIX):
            self._usage.add(rec.tenant, len(rec.data))
        self._schedule.add(rec.due_ms, rec.tenant, rec.id)

    def _drop_usage(self, rec: DelayedRecord) -> None:
        if not rec.id.startswith(WILL_PREFIX):
            self._usage.remove(rec.tenant, len(rec.data))

    def _unhold(self, tenant: str, id: str) -> DelayedRecord | None:
        rec = self._records.pop((tenant, id), None)
        if rec is not None:
            self._drop_usage(rec)
        return rec

    async def _wrote(self) -> None:
        """Several instances: the others learn that the store changed under their copy."""
        if self._generations is not None:
            await self._generations.wrote(DELAYED)


def _due(rec: DelayedRecord) -> int:
    return rec.due_ms


class DelayScheduler:
    """Publishes held records when due: on NATS for the nodes' subscribers (by reference
    when larger than one NATS message), through `route` for retained messages and the
    persistent queues, and to the rules. Run `run` as a task; `settle_will` answers a
    client that connected again."""

    def __init__(
        self,
        *,
        held: DelayedMessages,
        route: Route,
        nats: Client,
        holder: Holder | None = None,
        rules: RulesFeed | None = None,
        lease: Lease | None = None,
    ) -> None:
        self._held = held
        self._route = route
        self._nats = nats
        self._holder = holder
        # The rules engine's intake (services/rules/client.py): a delayed message (a
        # `$delayed` publish, a delayed will) reaches the rules when due.
        self._rules = rules
        # Several instances: only the holder of this lease fires (services/router/cluster.py).
        self._lease = lease

    async def run(self) -> None:
        """Publish delayed messages when due (looked for at least every `TURN_S`), until
        cancelled. A round that fails is logged; the next one runs."""
        while True:
            nxt = self._held.next_due_ms()
            wait = TURN_S if nxt is None else max(0.0, min(TURN_S, (nxt - now_ms()) / 1000))
            await self._held.changed(wait)
            try:
                await self._round()
            except Exception:  # a record's own failures are handled in `_fire`
                log.exception("delayed_round_failed")

    async def settle_will(self, tenant: str, client_id: str, publish_now: bool) -> bool:
        """The client connected again: its delayed will is published now (`publish_now`)
        or dropped, either way no longer held; False when none was held."""
        await self._held.fresh()
        id = will_id(client_id)
        rec = self._held.get(tenant, id)
        if rec is None:
            return False
        if publish_now:
            await self._publish(rec)
        return await self._held.cancel(tenant, id)

    async def _round(self) -> None:
        if not await self._may_fire():
            return
        for tenant, id in self._held.due(now_ms()):
            # Looked up at its turn: it may have been cancelled or replaced meanwhile.
            rec = self._held.get(tenant, id)
            if rec is not None:
                await self._fire(rec)

    async def _fire(self, rec: DelayedRecord) -> None:
        """Publish one due record, then forget it; if either fails it fires again later."""
        try:
            await self._publish(rec)
        except Exception:
            log.exception("delayed_publish_failed", extra={"id": rec.id})
            self._held.retry(rec, now_ms() + RETRY_MS)
            return
        try:
            await self._held.done(rec)
        except Exception:
            log.exception("delayed_delete_failed", extra={"id": rec.id})
            if self._held.get(rec.tenant, rec.id) is rec:  # the delete failed: fire it again
                self._held.retry(rec, now_ms() + RETRY_MS)

    async def _may_fire(self) -> bool:
        """Alone: always. Several instances: our delayed messages are the store's, and we
        hold the scheduler lease."""
        if self._lease is None:
            return True
        try:
            await self._held.fresh()
            return await self._lease.renew()
        except Exception:  # Redis unreachable: another instance may hold the lease
            log.warning("scheduler_lease_failed")
            return False

    async def _publish(self, rec: DelayedRecord) -> None:
        m = RoutedMessage.FromString(rec.data)
        m.published_at_ms = now_ms()
        rules = self._rules
        # To the rules alongside the publish, best effort as for the session service's wills:
        # a stream that is slow, away, or refuses it (larger than one NATS message) never
        # holds the message back; the rules miss it. A retry of the publish stores it again,
        # which the stream drops by its message id.
        feeding = (
            asyncio.ensure_future(rules.store([m]))
            if rules is not None and rules.wanted(m.tenant, m.topic)
            else None
        )
        batch = RoutedBatch()
        batch.messages.append(m)
        subject, data = topic_to_subject(m.tenant, m.topic), batch.SerializeToString()
        try:
            if self._holder is not None:  # larger than one NATS message: by reference
                await self._holder.publish(self._nats, subject, data)
            else:
                await self._nats.publish(subject, data)
            results, _ = await self._route([m])
        finally:  # awaited even when the publish failed: no task left behind unread
            if feeding is not None and not all(await feeding):
                log.warning("rules_feed_missed", extra={"id": rec.id, "tenant": m.tenant})
        if RouteResult.TRY_LATER in results:
            raise RuntimeError("persistent queues unavailable")
