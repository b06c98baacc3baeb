"""Consuming the durable streams the rules read: RULES (messages nodes stored for tenants with
rules) and EVENTS (client events, for `FROM "$events/..."` rules).

Every instance pulls from the same durable consumer, so JetStream splits the messages among
instances without duplicates in steady state. A batch is acknowledged once every output of it
was accepted by its action or dead-lettered; a batch whose outputs could not be handed over
is not acknowledged (negatively: redelivered at once), and neither is one whose instance dies,
which JetStream redelivers after `ack_wait`: at least once, never lost. While a batch's
outputs are being delivered (retries can take longer than `ack_wait`) its messages are marked
in progress every third of `ack_wait`, so a slow target does not cause redeliveries (and
duplicates) to another instance; only a dead instance's batches come back.

A message no installed rule matches is acknowledged without outputs -- but first, the tenant's
rules are read again from the store unless that was done after the message was published: a
rule created through another instance (which this one has not heard of yet), or whose install
failed here, then still gets the messages nodes stored for it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from services.common.bus import subjects
from services.common.bus.events import decode_events
from services.common.clock import now_ms
from services.rules.actions.base import Output
from services.rules.actions.delivery import Delivery
from services.rules.engine import Engine
from services.rules.sql import MessageView
from services.rules.sql.parse import EVENT_PREFIX, EVENT_SOURCES
from starling.common.v1 import event_pb2
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.rules.consumer")

DURABLE = "rules"
EVENTS_DURABLE = "rules-events"


def rules_stream_config(max_age_s: float, max_bytes: int, replicas: int = 1) -> StreamConfig:
    """`replicas`: 3 on a NATS cluster (setting nats_stream_replicas): a node's PUBACK for a
    message a rule reads waits for this stream's acknowledgement, which then means a quorum
    of servers wrote it (each with sync_interval always: on disk; file storage).

    Full (`max_bytes`): the stream refuses new messages (DiscardPolicy.NEW) and the node
    answers their publishers 0x97 (services/connection/rules_tap.py); the default, OLD,
    would delete acknowledged messages no rule has seen to make room. `max_age_s` 0: no
    age limit (the default; a positive one deletes messages no rule has seen yet)."""
    return StreamConfig(
        name=subjects.RULES_STREAM,
        subjects=[subjects.RULES_WILDCARD],
        # Work queue: a message leaves the stream once the rules acknowledged it.
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_age=max_age_s,
        max_bytes=max_bytes,
        duplicate_window=120.0,
        num_replicas=replicas,
    )


def view_of(env: RoutedMessage) -> MessageView:
    props = env.properties.user_properties
    return MessageView(
        env.tenant,
        env.topic,
        env.payload,
        qos=env.qos,
        retain=env.retain,
        clientid=env.publisher.client_id,
        username=env.publisher.username,
        node=env.publisher.node_id,
        published_at_ms=env.published_at_ms,
        message_id=env.message_id,
        user_properties=tuple((p.key, p.value) for p in props) if props else (),
    )


_EVENT_NAMES = {
    "EVENT_TYPE_CLIENT_CONNECTED": "connected",
    "EVENT_TYPE_CLIENT_DISCONNECTED": "disconnected",
    "EVENT_TYPE_SUBSCRIBED": "subscribed",
    "EVENT_TYPE_UNSUBSCRIBED": "unsubscribed",
}
# The `topic` a rule sees of each event: its FROM source (services/rules/sql/parse.py).
_EVENT_TOPICS = {kind: EVENT_PREFIX + source for source, kind in EVENT_SOURCES.items()}


def event_name(ev: event_pb2.Event) -> str | None:
    """The name rules know the event by (`connected`, ...); None for a kind they do not see."""
    return _EVENT_NAMES.get(event_pb2.EventType.Name(ev.type))


def event_view(ev: event_pb2.Event, seq: int | str) -> MessageView | None:
    name = event_name(ev)
    if name is None:
        return None
    detail: dict[str, object] = {"clientid": ev.client_id, "node": ev.node_id, "ts": ev.ts_ms}
    username = ""
    if name == "connected":
        c = ev.connected
        username = c.username
        detail.update(
            username=c.username,
            peer_address=c.peer_address,
            protocol_level=c.protocol_level,
            clean_start=c.clean_start,
        )
    elif name == "disconnected":
        d = ev.disconnected
        detail.update(reason_code=d.reason_code, reason=d.reason)
    elif name == "subscribed":
        sub = ev.subscribed
        username = sub.username
        detail.update(username=username, topic_filter=sub.topic_filter, qos=sub.qos, auto=sub.auto)
    else:
        unsub = ev.unsubscribed
        username = unsub.username
        detail.update(username=username, topic_filter=unsub.topic_filter)
    return MessageView(
        ev.tenant,
        _EVENT_TOPICS[name],
        json.dumps(detail).encode(),
        clientid=ev.client_id,
        username=username,
        node=ev.node_id,
        published_at_ms=ev.ts_ms,
        message_id=f"ev-{seq}",
        event=name,
    )


class StreamConsumer:
    def __init__(
        self,
        nc: Client,
        engine: Engine,
        *,
        batch: int,
        ack_wait_s: float,
        max_age_s: float,
        max_bytes: int,
        refresh: Callable[[str], Awaitable[None]] | None = None,
        replicas: int = 1,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._engine = engine
        self._batch = batch
        self._ack_wait_s = ack_wait_s
        self._max_age_s = max_age_s
        self._max_bytes = max_bytes
        self._replicas = replicas
        self._tasks: list[asyncio.Task[None]] = []
        self._refresh = refresh
        self._refreshed_ms: dict[str, int] = {}  # tenant -> wall time of its last refresh
        self.processed = 0

    async def prepare(self) -> None:
        """Create the RULES stream, or bring one made before (another discard policy, age
        limit, size or replica count) to this config; nodes store into it once they learn a
        filter. Logs what is waiting in it (`rules_stream_backlog`)."""
        cfg = rules_stream_config(self._max_age_s, self._max_bytes, self._replicas)
        try:
            # Same config: a no-op. Another one: refused ("already in use"), so update.
            await self._js.add_stream(cfg)
        except Exception:
            await self._js.update_stream(cfg)
            log.info("rules_stream_updated")
        state = (await self._js.stream_info(subjects.RULES_STREAM)).state
        if state.messages:
            # Waiting since the rules service was last up; near max_bytes, nodes answer 0x97.
            log.warning(
                "rules_stream_backlog",
                extra={"messages": state.messages, "bytes": state.bytes, "max": self._max_bytes},
            )

    async def start(self) -> None:
        """Start consuming: only once the rules are installed (a message pulled before would
        be acknowledged without reaching its rules)."""
        js = self._js
        consumer = ConsumerConfig(
            durable_name=DURABLE,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self._ack_wait_s,
            max_ack_pending=self._batch * 64,
        )
        sub = await js.pull_subscribe(
            subjects.RULES_WILDCARD, durable=DURABLE, stream=subjects.RULES_STREAM, config=consumer
        )
        self._tasks.append(asyncio.create_task(self._run(sub, self._messages)))
        self._tasks.append(asyncio.create_task(self._consume_events()))

    async def _consume_events(self) -> None:
        """The EVENTS stream is the session service's, which may start after this one."""
        js = self._js
        while True:
            try:
                await js.stream_info(subjects.EVENTS_STREAM)
                break
            except Exception:
                await asyncio.sleep(1.0)
        ev_consumer = ConsumerConfig(
            durable_name=EVENTS_DURABLE,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self._ack_wait_s,
            filter_subject=subjects.EVENTS_WILDCARD,
        )
        ev_sub = await js.pull_subscribe(
            subjects.EVENTS_WILDCARD,
            durable=EVENTS_DURABLE,
            stream=subjects.EVENTS_STREAM,
            config=ev_consumer,
        )
        await self._run(ev_sub, self._events)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self, sub: object, handle: object) -> None:
        while True:
            try:
                msgs = await sub.fetch(self._batch, timeout=1.0)  # type: ignore[attr-defined]
            except (TimeoutError, NatsTimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("rules_fetch_failed", extra={"error": type(exc).__name__})
                await asyncio.sleep(0.5)
                continue
            try:
                await handle(msgs)  # type: ignore[operator]
            except asyncio.CancelledError:
                raise
            except Exception:
                # E.g. the connection dropped while acknowledging: what was not acknowledged
                # comes back after ack_wait; the loop must go on.
                log.exception("rules_batch_failed")
                await asyncio.sleep(0.5)

    async def _messages(self, msgs: list[Msg]) -> None:
        pending: dict[Delivery, list[Output]] = {}
        engine = self._engine
        unmatched: list[RoutedMessage] = []
        for m in msgs:
            try:
                env = RoutedMessage.FromString(m.data)
            except Exception:
                log.warning("rules_bad_stream_message")
                continue
            rules = engine.match(env.tenant, env.topic)
            if rules:
                engine.evaluate(view_of(env), rules, pending)
            else:
                unmatched.append(env)
        if unmatched and self._refresh is not None:
            again = await self._refreshed(unmatched)
            if again is None:
                await self._nak(msgs)
                return
            for env in again:
                rules = engine.match(env.tenant, env.topic)
                if rules:
                    engine.evaluate(view_of(env), rules, pending)
        await self._settle(msgs, pending)

    async def _refreshed(self, unmatched: list[RoutedMessage]) -> list[RoutedMessage] | None:
        """Re-read the rules of each tenant of `unmatched` not refreshed since (a second
        before, for clock skew between nodes and this instance) its messages were published;
        the messages of those tenants, to be matched again; None if the store failed."""
        assert self._refresh is not None
        latest: dict[str, int] = {}
        for env in unmatched:
            latest[env.tenant] = max(latest.get(env.tenant, 0), env.published_at_ms)
        stale = {t for t, ms in latest.items() if self._refreshed_ms.get(t, 0) < ms + 1000}
        for tenant in stale:
            self._refreshed_ms[tenant] = now_ms()
            try:
                await self._refresh(tenant)
            except Exception as exc:  # the store failed: the batch is pulled again later
                log.warning("rules_refresh_failed", extra={"error": type(exc).__name__})
                self._refreshed_ms.pop(tenant, None)
                return None
        return [env for env in unmatched if env.tenant in stale]

    async def _events(self, msgs: list[Msg]) -> None:
        pending: dict[Delivery, list[Output]] = {}
        for m in msgs:
            events = decode_events(m.data)
            for i, ev in enumerate(events):
                # The rules first: most events (every CONNECT's) concern no rule, and building
                # the view (its JSON, the stream sequence from the reply subject) costs more.
                name = event_name(ev)
                rules = self._engine.match_event(ev.tenant, name) if name is not None else None
                if not rules:
                    continue
                seq = m.metadata.sequence.stream
                # The events of a batch share its stream sequence: each its own message id.
                view = event_view(ev, seq if len(events) == 1 else f"{seq}.{i}")
                if view is not None:
                    self._engine.evaluate(view, rules, pending)
        await self._settle(msgs, pending)

    async def _settle(self, msgs: list[Msg], pending: dict[Delivery, list[Output]]) -> None:
        try:
            if pending:
                await self._delivered(msgs, pending)
        except Exception as exc:
            log.warning("rules_delivery_failed", extra={"error": type(exc).__name__})
            await self._nak(msgs)
            return
        for m in msgs:
            await m.ack()
        self.processed += len(msgs)

    @staticmethod
    async def _nak(msgs: list[Msg]) -> None:
        """Give a batch back (pulled again after a second, by any instance)."""
        for m in msgs:
            await m.nak(delay=1.0)

    async def _delivered(self, msgs: list[Msg], pending: dict[Delivery, list[Output]]) -> None:
        """Deliver `pending`, marking `msgs` in progress while it takes."""
        delivery = asyncio.ensure_future(self._engine.deliver(pending))
        try:
            while not delivery.done():
                await asyncio.wait({delivery}, timeout=self._ack_wait_s / 3)
                if not delivery.done():
                    for m in msgs:
                        await m.in_progress()
        except BaseException:
            delivery.cancel()
            raise
        delivery.result()
