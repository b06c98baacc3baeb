"""What the router does with a publish: delayed ones wait, retained ones are stored, QoS>=1
ones go to every matching persistent session's queue. Also the delayed-publish scheduler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.common.bus import subjects
from services.common.bus.large import Holder
from services.common.bus.publisher import RulesFeed
from services.common.refusals import Refusals
from services.common.rpc.errors import ServiceError
from services.common.store.ports import DelayedRecord, RetainedRecord, RouterStore
from services.common.telemetry import TENANT_ATTRIBUTE, message_spans
from services.common.topics import topic_to_subject
from services.common.topics.delayed import DelayedTopic, parse_delayed
from services.queue.client import AppendResult, QueueClient, StaleRoutesError
from services.quota.copies import LimitsCopies
from services.router.cluster import DELAYED, Shared
from services.router.core import RouteResult, RouteTable, plan, settle
from services.router.delayed import Schedule
from services.router.fencing import RouteFence
from services.router.limits import Caps, Usage, fits
from services.router.retained import Retained, RetainedIndex, is_sys
from starling.common.v1 import event_pb2
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

log = logging.getLogger("starling.router")
tracer = trace.get_tracer("starling.router")
# A tenant at a retained cap has its expired retained messages purged at most this often.
PURGE_EVERY_MS = 1000
# Several instances: appends refused as stale this often in a row make the batch TRY_LATER.
_CHECKS = 3


WILL_PREFIX = "will/"


def will_id(client_id: str) -> str:
    """Id of a client's delayed will among the delayed messages (one per client)."""
    return WILL_PREFIX + client_id


class _RetainedCaps(NamedTuple):
    """A tenant's retained caps (0: none) and the refusal label of each."""

    messages: int
    messages_label: str
    bytes: int
    bytes_label: str


def _expires_at_ms(m: RoutedMessage) -> int:
    if m.properties.HasField("message_expiry_interval_s"):
        return m.published_at_ms + m.properties.message_expiry_interval_s * 1000
    return 0


class Publisher:
    def __init__(
        self,
        table: RouteTable,
        queues: QueueClient,
        retained: RetainedIndex,
        store: RouterStore,
        nats: Any,
        caps: Caps,
        queue_qos0: bool,
        fence: RouteFence,
        refusals: Refusals | None = None,
        limits: LimitsCopies | None = None,
    ) -> None:
        self._table = table
        # Tenants' retained quotas (quota service), below the caps of the settings.
        self._limits = limits
        self._queues = queues
        self._retained = retained
        self._store = store
        self._nats = nats
        self._caps = caps
        self._qos0 = queue_qos0
        self.fence = fence
        self.refusals = refusals or Refusals()
        # Set from the settings by services/router/main.py: with no sampling anywhere no
        # message carries a trace context, so none is looked for.
        self.tracing = True
        self.schedule = Schedule()
        self.delayed: dict[tuple[str, str], DelayedRecord] = {}
        # Pending `$delayed` messages per tenant (delayed wills, one per client id, are not
        # counted: a cap must never lose a will).
        self.delayed_usage = Usage()
        self._purged_at: dict[str, int] = {}  # tenant -> last purge of expired retained
        self._wake = asyncio.Event()
        self.holder: Holder | None = None  # set once NATS is connected (services/router/main.py)
        # The rules engine's intake (services/rules/client.py), also set once NATS is up: a
        # delayed message (a `$delayed` publish, a delayed will) reaches the rules when due.
        self.rules: RulesFeed | None = None
        # Several router instances (services/router/cluster.py); None: this one is alone.
        self.shared: Shared | None = None

    async def load(self) -> None:
        """Retained and delayed messages from the store; the caps' usage follows from them."""
        for r in await self._store.all_retained():
            self._retained.put(r.tenant, r.topic, Retained(r.data, r.expires_at_ms))
        await self._load_delayed()

    async def _load_delayed(self) -> None:
        g = await self.shared.generations.stale(DELAYED) if self.shared else None
        self.delayed.clear()
        self.delayed_usage = Usage()
        self.schedule = Schedule()
        for d in await self._store.all_delayed():
            self._hold(d)
        if self.shared is not None and g is not None:
            self.shared.generations.adopt(DELAYED, g)

    async def wrote(self, key: str) -> None:
        """Several instances: the others learn that the store changed under their copy."""
        if self.shared is not None:
            await self.shared.generations.wrote(key)

    async def fresh_retained(self, tenant: str) -> None:
        """Several instances: the tenant's retained index is the store's (reloaded if another
        instance wrote since we looked)."""
        if self.shared is None:
            return
        g = await self.shared.generations.stale("retained:" + tenant)
        if g is None:
            return
        self._retained.drop_tenant(tenant)
        for r in await self._store.tenant_retained(tenant):
            self._retained.put(r.tenant, r.topic, Retained(r.data, r.expires_at_ms))
        self.shared.generations.adopt("retained:" + tenant, g)

    async def fresh_delayed(self) -> None:
        """Several instances: the delayed messages are the store's (reloaded if another
        instance wrote since we looked)."""
        if self.shared is not None and await self.shared.generations.stale(DELAYED) is not None:
            await self._load_delayed()

    async def accept(self, messages: list[RoutedMessage]) -> tuple[list[RouteResult], int]:
        """Handle publishes from a node; one RouteResult per message, and queues touched."""
        results = [RouteResult.NO_MATCH] * len(messages)
        to_route: list[tuple[int, RoutedMessage]] = []
        for i, m in enumerate(messages):
            if m.delay_s:  # a will with a delay: held until due or settled
                held = RoutedMessage()
                held.CopyFrom(m)
                held.delay_s = 0
                await self.delay_will(held, m.delay_s)
                results[i] = RouteResult.STORED
                continue
            delayed = parse_delayed(m.topic)
            if delayed is not None:
                stored = await self._delay(m, delayed)
                results[i] = RouteResult.STORED if stored else RouteResult.QUOTA_EXCEEDED
                continue
            if m.retain and not await self._retain(m):
                results[i] = RouteResult.QUOTA_EXCEEDED
            to_route.append((i, m))
        # Messages sampled where they were published carry their trace context.
        traced = [(i, m) for i, m in to_route if m.trace_context] if self.tracing else []
        spans = message_spans(
            tracer,
            "router.route",
            (
                (m.trace_context, {TENANT_ATTRIBUTE: m.tenant, "mqtt.topic": m.topic})
                for _, m in traced
            ),
            SpanKind.SERVER,
        )
        try:
            queues = await self._route(to_route, results)
        finally:
            for span, (i, _) in zip(spans, traced, strict=True):
                span.set_attribute("starling.route_result", RouteResult(results[i]).name)
                span.end()
        return results, queues

    async def _route(
        self, items: list[tuple[int, RoutedMessage]], results: list[RouteResult]
    ) -> int:
        if self.shared is not None:
            by_tenant: dict[str, list[tuple[int, RoutedMessage]]] = {}
            for i, m in items:
                by_tenant.setdefault(m.tenant, []).append((i, m))
            routed = 0
            for tenant, group in by_tenant.items():
                routed += await self._route_checked(tenant, group, results)
            return routed
        queues = 0
        for tenant, (entries, owners) in plan(self._table, items, self._qos0).items():
            outcomes: list[AppendResult | None]
            try:
                outcomes = list(
                    await self._queues.append(
                        tenant, entries, routes_current=self.fence.version(tenant)
                    )
                )
            except ServiceError as exc:
                log.warning("queue_append_failed", extra={"code": exc.code.name})
                outcomes = [None] * len(entries)  # nothing known to be stored
            settle(results, owners, outcomes)
            queues += len(entries)
        return queues

    async def _route_checked(
        self, tenant: str, items: list[tuple[int, RoutedMessage]], results: list[RouteResult]
    ) -> int:
        """Several instances: route from our table as a node's copy does, checked by the
        queue against the version every queue holds (even with no entries: that answer is
        what says no persistent session matches); refused, catch up and route again."""
        for _ in range(_CHECKS):
            try:
                version = await self.fence.routing_version(tenant)
                entries, owners = plan(self._table, items, self._qos0).get(tenant, ([], []))
                outcomes: list[AppendResult | None] = list(
                    await self._queues.append(tenant, entries, routes_checked=version)
                )
            except StaleRoutesError:
                try:
                    await self.fence.catch_up(tenant, version)
                except Exception:  # the queues unreachable: the node retries the batch
                    log.warning("route_catch_up_failed", extra={"tenant": tenant})
                    break
                continue
            except ServiceError as exc:
                log.warning("queue_append_failed", extra={"code": exc.code.name})
                entries, owners, outcomes = [], [i for i, _ in items], [None] * len(items)
            except RuntimeError:  # the version kept moving
                break
            settle(results, owners, outcomes)
            return len(entries)
        for i, _ in items:
            results[i] = RouteResult.TRY_LATER
        return 0

    async def _retain(self, m: RoutedMessage) -> bool:
        """Store (or, for an empty payload, delete [MQTT-3.3.1-10]) the retained message;
        False when the tenant's retained caps refuse it (a delete is never refused)."""
        await self.fresh_retained(m.tenant)
        if not m.payload:
            self._retained.delete(m.tenant, m.topic)
            await self._store.delete_retained(m.tenant, m.topic)
            await self.wrote("retained:" + m.tenant)
            return True
        data = m.SerializeToString()
        # `$SYS` figures (services/metrics/sys_publisher.py) are the server's, never refused
        # (nor do they make the router ask for the tenant's limits).
        if not is_sys(m.topic):
            caps = await self._retained_caps(m.tenant)
            if not await self._retained_fits(m.tenant, m.topic, len(data), caps):
                limit = self._retained_limit(m.tenant, m.topic, len(data), caps)
                self.refusals.count(limit, m.tenant)
                await self._quota_event(m.tenant, limit)
                return False
        await self._store.put_retained(RetainedRecord(m.tenant, m.topic, data, _expires_at_ms(m)))
        self._retained.put(m.tenant, m.topic, Retained(data, _expires_at_ms(m)))
        await self.wrote("retained:" + m.tenant)
        return True

    async def _retained_caps(self, tenant: str) -> _RetainedCaps:
        """The tenant's retained caps: the setting's, or its quota's where that is lower."""
        caps = _RetainedCaps(
            self._caps.retained_messages,
            "retained_messages",
            self._caps.retained_bytes,
            "retained_bytes",
        )
        if self._limits is None:
            return caps
        quota = (await self._limits.fetch(tenant)).limits
        n, size = quota.max_retained_messages, quota.max_retained_bytes
        if n and (not caps.messages or n < caps.messages):
            caps = caps._replace(messages=n, messages_label="max_retained_messages")
        if size and (not caps.bytes or size < caps.bytes):
            caps = caps._replace(bytes=size, bytes_label="max_retained_bytes")
        return caps

    def _retained_growth(self, tenant: str, topic: str, nbytes: int) -> tuple[int, int]:
        old = self._retained.get(tenant, topic)
        return (1, nbytes) if old is None else (0, nbytes - len(old.data))

    def _retained_limit(self, tenant: str, topic: str, nbytes: int, caps: _RetainedCaps) -> str:
        """Which retained cap a refused message hit (its refusal label)."""
        add_count, _ = self._retained_growth(tenant, topic, nbytes)
        cap = caps.messages
        if cap and add_count and self._retained.count(tenant) + add_count > cap:
            return caps.messages_label
        return caps.bytes_label

    async def _retained_fits(
        self, tenant: str, topic: str, nbytes: int, caps: _RetainedCaps
    ) -> bool:
        """Within the caps, counting expired messages out: at a cap, the tenant's expired
        retained messages are purged first (at most once per PURGE_EVERY_MS, so a client
        hammering a full tenant does not make every publish walk its whole index)."""
        for attempt in (0, 1):
            add_count, add_bytes = self._retained_growth(tenant, topic, nbytes)
            if fits(
                self._retained.count(tenant),
                self._retained.size(tenant),
                add_count,
                add_bytes,
                caps.messages,
                caps.bytes,
            ):
                return True
            if attempt or not await self._purge_expired(tenant):
                return False
        return False

    async def _purge_expired(self, tenant: str) -> bool:
        """Forget the tenant's expired retained messages; True when any were."""
        now = int(time.time() * 1000)
        if now - self._purged_at.get(tenant, -PURGE_EVERY_MS) < PURGE_EVERY_MS:
            return False
        self._purged_at[tenant] = now
        topics = self._retained.expired(tenant, now)
        for topic in topics:
            self._retained.delete(tenant, topic)
            await self._store.delete_retained(tenant, topic)
        if topics:
            await self.wrote("retained:" + tenant)
        return bool(topics)

    async def _quota_event(self, tenant: str, limit: str) -> None:
        ev = event_pb2.Event(
            tenant=tenant,
            type=event_pb2.EVENT_TYPE_QUOTA_EXCEEDED,
            ts_ms=int(time.time() * 1000),
            quota_exceeded=event_pb2.QuotaExceeded(limit=limit),
        )
        try:
            await self._nats.publish(
                subjects.event(tenant, "quota_exceeded"), ev.SerializeToString()
            )
        except Exception:  # events are best effort; the refusal itself is what matters
            log.warning("event_publish_failed")

    async def _delay(self, m: RoutedMessage, d: DelayedTopic, id: str = "") -> bool:
        """Hold `m` until due; False when the tenant's delayed caps refuse it. A `$delayed`
        message already held (the node retrying the same message id) is not held twice; a
        will replaces the client's will held before."""
        key = (m.tenant, id or m.message_id)
        await self.fresh_delayed()
        if not id and key in self.delayed:
            return True
        inner = RoutedMessage()
        inner.CopyFrom(m)
        inner.topic = d.topic
        due = int(time.time() * 1000) + d.seconds * 1000
        rec = DelayedRecord(key[1], m.tenant, due, inner.SerializeToString())
        if not id:
            limit = self._delayed_limit(m.tenant, len(rec.data))
            if limit:
                self.refusals.count(limit, m.tenant)
                await self._quota_event(m.tenant, limit)
                return False
        await self._store.put_delayed(rec)
        self._hold(rec)
        await self.wrote(DELAYED)
        self._wake.set()
        return True

    def _delayed_limit(self, tenant: str, nbytes: int) -> str:
        """The delayed cap one more message of `nbytes` would break ("": none)."""
        u, caps = self.delayed_usage, self._caps
        if fits(u.count(tenant), u.size(tenant), 1, nbytes, caps.delayed_messages, 0):
            if fits(u.count(tenant), u.size(tenant), 1, nbytes, 0, caps.delayed_bytes):
                return ""
            return "delayed_bytes"
        return "delayed_messages"

    def _hold(self, rec: DelayedRecord) -> None:
        old = self.delayed.get((rec.tenant, rec.id))
        if old is not None:
            self._drop_usage(old)
        self.delayed[(rec.tenant, rec.id)] = rec
        if not rec.id.startswith(WILL_PREFIX):
            self.delayed_usage.add(rec.tenant, len(rec.data))
        self.schedule.add(rec.due_ms, rec.tenant, rec.id)

    def _drop_usage(self, rec: DelayedRecord) -> None:
        if not rec.id.startswith(WILL_PREFIX):
            self.delayed_usage.remove(rec.tenant, len(rec.data))

    def _unhold(self, tenant: str, id: str) -> DelayedRecord | None:
        rec = self.delayed.pop((tenant, id), None)
        if rec is not None:
            self._drop_usage(rec)
        return rec

    async def delay_will(self, m: RoutedMessage, delay_s: int) -> None:
        """A will with a delay: published when due unless the client comes back first."""
        await self._delay(m, DelayedTopic(delay_s, m.topic), will_id(m.publisher.client_id))

    async def settle_will(self, tenant: str, client_id: str, publish_now: bool) -> bool:
        await self.fresh_delayed()
        id = will_id(client_id)
        rec = self.delayed.get((tenant, id))
        if rec is None:
            return False
        if publish_now:
            await self._publish_due(rec)
        return await self.cancel(tenant, id)

    async def cancel(self, tenant: str, id: str) -> bool:
        await self.fresh_delayed()
        rec = self._unhold(tenant, id)
        if rec is None:
            return False
        self.schedule.cancel(tenant, id)
        await self._store.delete_delayed(tenant, id)
        await self.wrote(DELAYED)
        return True

    async def run_scheduler(self) -> None:
        """Publish delayed messages when due (checked at least every 200 ms)."""
        while True:
            now = int(time.time() * 1000)
            nxt = self.schedule.next_due_ms()
            wait = 0.2 if nxt is None else max(0.0, min(0.2, (nxt - now) / 1000))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass
            if not await self._may_fire():
                continue
            for tenant, id in self.schedule.pop_due(int(time.time() * 1000)):
                rec = self.delayed.get((tenant, id))
                if rec is None:
                    continue
                try:
                    await self._publish_due(rec)
                except Exception:  # keep it scheduled: try again shortly
                    log.exception("delayed_publish_failed", extra={"id": id})
                    self.schedule.add(int(time.time() * 1000) + 1000, tenant, id)
                    continue
                self._unhold(tenant, id)
                await self._store.delete_delayed(tenant, id)
                await self.wrote(DELAYED)

    async def _may_fire(self) -> bool:
        """Alone: always. Several instances: our delayed messages are the store's, and we
        hold the scheduler lease (services/router/cluster.py)."""
        if self.shared is None:
            return True
        try:
            await self.fresh_delayed()
            return await self.shared.scheduler.renew()
        except Exception:  # Redis unreachable: another instance may hold the lease
            log.warning("scheduler_lease_failed")
            return False

    async def _publish_due(self, rec: DelayedRecord) -> None:
        m = RoutedMessage.FromString(rec.data)
        m.published_at_ms = int(time.time() * 1000)
        rules = self.rules
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
            if self.holder is not None:  # larger than one NATS message: by reference
                await self.holder.publish(self._nats.nc, subject, data)
            else:
                await self._nats.publish(subject, data)
            results, _ = await self.accept([m])
        finally:  # awaited even when the publish failed: no task left behind unread
            if feeding is not None and not all(await feeding):
                log.warning("rules_feed_missed", extra={"id": rec.id, "tenant": m.tenant})
        if RouteResult.TRY_LATER in results:
            raise RuntimeError("persistent queues unavailable")
