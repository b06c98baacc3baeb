"""A connection node: binds channels to transports, the mesh (NATS) and the session service.

Theory of operation:
- `Conn.receive` feeds bytes to the channel, then `Node.after` carries out what the channel
  produced: bytes to the socket, messages to NATS (through one FIFO publisher task, so a
  client's publishes keep their order), and actions (authenticate, subscribe, close).
- A publish is delivered to this node's own subscribers directly from the trie (one hop) and
  sent once on NATS for the other nodes; the NATS connection is `no_echo`, so it never comes
  back here. Shared-subscription queue groups live on a second connection (`nc_shared`), so
  NATS still picks among this node's members too. Messages from other nodes land in
  `_on_mesh`, which matches the tenant's trie once per batch and delivers to each matching
  client once. Writes are batched: channels are
  marked dirty and flushed together once per loop iteration.
- NATS subscribe/unsubscribe operations run in order on one control task; the SUBACK of a
  SUBSCRIBE is written after its NATS subscriptions are confirmed by a flush.
- Flow control: when the queue of publishes waiting for NATS, or the backlog of mesh messages
  waiting for delivery, passes a high-water mark, the node stops reading from client sockets
  (TCP pushes back on publishers) and resumes below the low-water mark. Without it a QoS 0
  flood starves the NATS side and the node drops what it already accepted.
- Kicks (takeover, admin) arrive on `ctl.node.<node_id>`; a kick for a connection still
  authenticating leaves a tombstone that refuses it when its CONNECT answer arrives.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from opentelemetry import context as otel_context
from opentelemetry import trace

from services.common.acl import Access, AclRule
from services.common.bus import subjects
from services.common.mqtt.packets import Subscription
from services.common.mqtt.reason import ReasonCode as RC
from services.common.telemetry import extract, inject
from services.common.topics import parse_shared, topic_to_subject
from services.connection.actions import (
    Authenticate,
    AuthResult,
    Close,
    Message,
    SubscribeRequest,
    Unsubscribed,
    message_properties,
)
from services.connection.channel import Channel, ChannelConfig, State, requested_session_expiry
from services.connection.envelope import add_to_batch, from_envelope, to_envelope
from services.connection.persistence import PersistentDelivery, QueuePort
from services.connection.routing import RoutingPipeline
from services.connection.subscriptions import (
    NodeSubscriptions,
    SharedGroup,
    SubEntry,
    entry_for,
    redelivery_subject,
    should_process,
)
from services.queue.client import queue_id
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage
from starling.connection.v1 import connection_pb2
from starling.router.v1 import router_pb2
from starling.session.v1 import session_pb2

log = logging.getLogger("starling.connection")
tracer = trace.get_tracer("starling.connection")

_CONNECT_CODES = {
    session_pb2.CONNECT_RESULT_BAD_CREDENTIALS: RC.BAD_USER_NAME_OR_PASSWORD,
    session_pb2.CONNECT_RESULT_NOT_AUTHORIZED: RC.NOT_AUTHORIZED,
    session_pb2.CONNECT_RESULT_CLIENT_ID_INVALID: RC.CLIENT_IDENTIFIER_NOT_VALID,
    session_pb2.CONNECT_RESULT_SERVER_BUSY: RC.SERVER_BUSY,
}


class Sink(Protocol):
    """The transport side of a connection (TCP/TLS transport or WebSocket writer)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class SubscriptionPort(Protocol):
    async def subscribe(
        self,
        tenant: str,
        client_id: str,
        incarnation: int,
        subs: list[router_pb2.PersistentSubscription],
    ) -> None: ...

    async def unsubscribe(
        self, tenant: str, client_id: str, incarnation: int, filters: list[str]
    ) -> None: ...

    async def route(self, messages: list[RoutedMessage]) -> list[int]: ...

    async def get_retained(
        self,
        tenant: str,
        topic_filter: str,
        queue_id: str = "",
        qos: int = 0,
        subscription_identifier: int = 0,
    ) -> list[RoutedMessage]: ...

    async def settle_will(self, tenant: str, client_id: str, publish_now: bool) -> bool: ...


class SessionPort(Protocol):
    async def connect(self, request: session_pb2.ConnectRequest) -> session_pb2.ConnectResponse: ...

    async def disconnect(
        self,
        tenant: str,
        client_id: str,
        epoch: int,
        node_id: str,
        incarnation: int,
        expiry_s: int | None,
    ) -> bool: ...


# Flow-control marks (messages).
PUBLISH_HIGH = 1000
PUBLISH_LOW = 200
INBOUND_HIGH_BYTES = 1 << 20  # mesh data received but not yet delivered
INBOUND_LOW_BYTES = 256 << 10
CHECK_EVERY = 256
MAX_BATCH = 64  # messages per NATS message
DELAYED_PREFIX = "$delayed/"
HOPS_HEADER = "Starling-Hops"  # times a shared message was handed back to its group
MAX_SHARED_HOPS = 3
FLUSH_EVERY = 1000  # messages between PING/PONG barriers under load


@dataclass(slots=True)
class TenantCounters:
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0


def _worker_died(task: asyncio.Task[None]) -> None:
    """A node worker must run until shutdown; if one dies, say so loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.critical(
            "node_worker_died", extra={"worker": task.get_name()}, exc_info=task.exception()
        )


class Conn:
    __slots__ = ("channel", "closed", "node", "persistent", "registered", "sink")

    def __init__(self, node: Node, channel: Channel, sink: Sink) -> None:
        self.node = node
        self.channel = channel
        self.sink = sink
        self.closed = False
        self.registered = False
        self.persistent: PersistentDelivery | None = None

    def receive(self, data: bytes) -> None:
        ch = self.channel
        ch.receive(data, time.time())
        ob = ch.outbound
        if ch.out or ch.publishes or ch.actions or ob.completed or ob.released:
            self.node.after(self)

    def flush(self) -> None:
        out = self.channel.out
        if out:
            self.sink.write(bytes(out))
            out.clear()

    def lost(self) -> None:
        """The transport closed (either side)."""
        self.channel.connection_lost()
        self.node.cleanup(self)


class Node:
    def __init__(
        self,
        config: ChannelConfig,
        nc: Client,
        session: SessionPort,
        tracing: bool = False,
        nc_shared: Client | None = None,
        router: SubscriptionPort | None = None,
        queue: QueuePort | None = None,
    ) -> None:
        self.config = config
        self.router = router
        self.queue = queue
        self.routing = (
            RoutingPipeline(router, self._routed, self._routing_gave_up)
            if router is not None
            else None
        )
        self.node_id = config.node_id
        self.nc = nc  # connected with no_echo
        self.nc_shared = nc_shared or nc
        self.session = session
        self.tracing = tracing
        self.conns: set[Conn] = set()
        self.clients: dict[tuple[str, str], dict[int, Conn]] = {}
        self.subs: NodeSubscriptions[Conn] = NodeSubscriptions()
        self.counters: dict[str, TenantCounters] = {}
        self._nats_subs: dict[str, NatsSubscription] = {}
        self._tombstones: dict[tuple[str, str], tuple[int, float]] = {}
        self._dirty: set[Conn] = set()
        self._flush_scheduled = False
        # (subject, batch) in publish order; consecutive messages to one subject share a batch.
        self._pub_queue: list[tuple[str, RoutedBatch]] = []
        self._queued = 0
        self._pub_wake = asyncio.Event()
        self._ctl_queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._ids = itertools.count(1)
        self._ctl_sub: NatsSubscription | None = None
        self._loop = asyncio.get_event_loop()
        self.paused = False
        self._since_check = 0
        self._throttled: set[Conn] = set()

    # ---- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ctl_sub = await self.nc.subscribe(
            subjects.node_control(self.node_id), cb=self._on_control
        )
        self._routes_sub = await self.nc.subscribe(subjects.ROUTE_LISTING, cb=self._on_routes)
        # Before any client connects: the session service releases what an earlier life
        # of this node id held (after a crash and restart).
        await self.nc.publish(subjects.node_hello(self.node_id), self.node_id.encode())
        await self.nc.flush(timeout=5)
        self._workers = [
            asyncio.create_task(self._publisher(), name="node-publisher"),
            asyncio.create_task(self._controller(), name="node-controller"),
            asyncio.create_task(self._sweeper(), name="node-sweeper"),
        ]
        if self.routing is not None:
            self._workers.append(asyncio.create_task(self.routing.run(), name="node-routing"))
        for w in self._workers:
            w.add_done_callback(_worker_died)

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """Tell every client 0x8B, publish their wills, drain the mesh."""
        for conn in list(self.conns):
            conn.channel.disconnect(RC.SERVER_SHUTTING_DOWN, "server shutting down")
            self.after(conn)
        deadline = time.monotonic() + grace_s
        # Polling is fine here: it runs once, on the way out, for at most `grace_s`.
        while (self._queued or not self._ctl_queue.empty()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.1, deadline - time.monotonic()))
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        try:
            await self.nc.flush(timeout=1)
        except Exception:
            log.warning("nats_flush_failed_on_shutdown")

    def open(self, sink: Sink, peer: str) -> Conn:
        conn = Conn(self, Channel(self.config, peer, time.time()), sink)
        self.conns.add(conn)
        return conn

    # ---- after the channel ran ----------------------------------------------------------

    def after(self, conn: Conn) -> None:
        ch = conn.channel
        ob = ch.outbound
        if (ob.completed or ob.released) and conn.persistent is not None:
            conn.persistent.progress()
        if ch.publishes:
            msgs = ch.publishes
            ch.publishes = []
            self.route(msgs, conn)
            if self.paused and conn not in self._throttled:
                self._throttle(conn)
        if ch.actions:
            actions = ch.actions
            ch.actions = []
            for action in actions:
                if type(action) is SubscribeRequest:
                    self._subscribe(conn, action, persist=ch.persistent)
                elif type(action) is Unsubscribed:
                    self._unsubscribe(conn, action.filters, persist=ch.persistent)
                elif type(action) is Authenticate:
                    self._spawn(self._authenticate(conn, action))
                elif type(action) is Close:
                    conn.flush()
                    conn.sink.close()
                    self.cleanup(conn)
        if ch.out and not conn.closed:
            self._mark_dirty(conn)

    def mark_dirty(self, conn: Conn) -> None:
        if not conn.closed:
            self._mark_dirty(conn)

    def _mark_dirty(self, conn: Conn) -> None:
        self._dirty.add(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        dirty = self._dirty
        self._dirty = set()
        for conn in dirty:
            if not conn.closed:
                conn.flush()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- publishing into the mesh -------------------------------------------------------

    def _routed(self, conn: Conn | None, pid: int, result: int) -> None:
        """The router stored a QoS>=1 publish: the publisher gets its PUBACK/PUBREC now
        (0x97 on MQTT 5 when the tenant's retained-message cap refused its retained part)."""
        if conn is not None and pid and not conn.closed:
            quota = result == router_pb2.ROUTE_RESULT_QUOTA_EXCEEDED and conn.channel.level == 5
            conn.channel.ack_publish(pid, RC.QUOTA_EXCEEDED if quota else 0)
            self._mark_dirty(conn)

    def _routing_gave_up(self, conn: Conn | None) -> None:
        if conn is not None and not conn.closed:
            conn.channel.disconnect(RC.SERVER_BUSY, "persistent routing unavailable")
            self.after(conn)

    def route(self, msgs: list[Message], conn: Conn | None = None) -> None:
        self._since_check += len(msgs)
        if self._since_check >= CHECK_EVERY or self._queued > PUBLISH_HIGH:
            self._since_check = 0
            self._check_pressure()
        queue = self._pub_queue
        counters = self._counters(msgs[0].tenant)
        node_id = self.node_id
        prefix = node_id + "-"
        ids = self._ids
        trie = self.subs.tries.get(msgs[0].tenant)
        last_topic = None
        matches: list[tuple[Conn, SubEntry]] = []
        for msg in msgs:
            counters.messages_in += 1
            if msg.topic.startswith(DELAYED_PREFIX) and self.routing is not None:
                # Delayed publish: only the router sees it now; it publishes when due.
                self.routing.submit(
                    conn, msg.packet_id, to_envelope(msg, node_id, prefix + str(next(ids)))
                )
                continue
            subject = topic_to_subject(msg.tenant, msg.topic)
            if queue and queue[-1][0] == subject and len(queue[-1][1].messages) < MAX_BATCH:
                batch = queue[-1][1]
            else:
                batch = RoutedBatch()
                queue.append((subject, batch))
            env = add_to_batch(batch, msg, node_id, prefix + str(next(ids)))
            if self.tracing:
                with tracer.start_as_current_span(
                    "mqtt.publish",
                    kind=trace.SpanKind.PRODUCER,
                    attributes={
                        "mqtt.topic": msg.topic,
                        "starling.node": node_id,
                        "starling.tenant": msg.tenant,
                        "mqtt.qos": msg.qos,
                    },
                ):
                    carrier = inject()
                if carrier:
                    env.trace_context.update(carrier)
                    msg = msg._replace(trace_context=tuple(carrier.items()))
            if trie is not None:
                if msg.topic != last_topic:
                    last_topic = msg.topic
                    matches = trie.match(msg.topic)
                if matches:
                    if self.tracing and msg.trace_context:
                        self._deliver_traced(msg, matches, msg.publisher)
                    else:
                        self._deliver(msg, matches, msg.publisher)
            if (msg.qos or msg.retain) and self.routing is not None:
                # Persistent sessions (and retained messages): stored before the publisher
                # is acknowledged.
                self.routing.submit(conn, msg.packet_id, env)
        self._queued += len(msgs)
        self._pub_wake.set()

    def _routing_backlog(self) -> int:
        return len(self.routing) if self.routing is not None else 0

    def _inbound_backlog(self) -> int:
        """Bytes NATS handed us that no subscription task has delivered yet."""
        return sum(sub.pending_bytes for sub in self._nats_subs.values())

    def _check_pressure(self) -> None:
        if not self.paused and (
            self._queued > PUBLISH_HIGH
            or self._inbound_backlog() > INBOUND_HIGH_BYTES
            or self._routing_backlog() > PUBLISH_HIGH
        ):
            # Only connections that publish while the node is saturated are throttled, so
            # subscribers keep reading and their PUBACKs keep freeing inflight windows.
            self.paused = True
            self._loop.call_later(0.002, self._maybe_resume)

    def _throttle(self, conn: Conn) -> None:
        pause = getattr(conn.sink, "pause_reading", None)
        if pause is not None:
            pause()
            self._throttled.add(conn)

    def _maybe_resume(self) -> None:
        if (
            self._queued > PUBLISH_LOW
            or self._inbound_backlog() > INBOUND_LOW_BYTES
            or self._routing_backlog() > PUBLISH_LOW
        ):
            self._loop.call_later(0.002, self._maybe_resume)
            return
        self.paused = False
        throttled, self._throttled = self._throttled, set()
        for conn in throttled:
            resume = getattr(conn.sink, "resume_reading", None)
            if resume is not None and not conn.closed:
                resume()

    async def _publisher(self) -> None:
        """Drain the publish queue into NATS, in order.

        Under load a PING/PONG barrier (`flush`) follows every FLUSH_EVERY messages, and they
        count as queued until it returns: NATS answers after routing everything published
        before it, so what NATS still holds for this node shows up in the subscriptions'
        pending bytes instead of hiding in server buffers where flow control cannot see it.
        """
        nc = self.nc
        unconfirmed = 0
        while True:
            await self._pub_wake.wait()
            self._pub_wake.clear()
            pending = self._pub_queue
            self._pub_queue = []
            for subject, batch in pending:
                try:
                    await nc.publish(subject, batch.SerializeToString())
                except Exception:  # never let one publish stop the node
                    log.exception("mesh_publish_failed", extra={"subject": subject})
                unconfirmed += len(batch.messages)
            if unconfirmed >= FLUSH_EVERY:
                try:
                    await nc.flush(timeout=5)
                except Exception:  # a slow or lost barrier must not stop publishing
                    log.warning("mesh_flush_failed")
            self._queued -= unconfirmed
            unconfirmed = 0
            if self._pub_queue:
                self._pub_wake.set()

    # ---- delivering from the mesh -------------------------------------------------------

    async def _on_mesh(self, msg: Msg, received_on: str) -> None:
        envs = RoutedBatch.FromString(msg.data).messages
        if not envs:
            return
        first = envs[0]
        trie = self.subs.tries.get(first.tenant)
        if trie is None:
            return
        # One batch carries one tenant and topic: match once for all of its messages.
        matches = trie.match(first.topic)
        if not matches or (
            len(matches) > 1 and not should_process(received_on, msg.subject, matches)
        ):
            return
        for env in envs:
            message = from_envelope(env)
            if message.trace_context and self.tracing:
                self._deliver_traced(message, matches, env.publisher.client_id)
            else:
                self._deliver(message, matches, env.publisher.client_id)

    def _deliver_traced(
        self, message: Message, matches: list[tuple[Conn, SubEntry]], publisher: str
    ) -> None:
        token = otel_context.attach(extract(dict(message.trace_context)))
        try:
            with tracer.start_as_current_span(
                "mqtt.deliver",
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "mqtt.topic": message.topic,
                    "starling.node": self.node_id,
                    "starling.tenant": message.tenant,
                    "mqtt.recipients": len(matches),
                },
            ):
                self._deliver(message, matches, publisher)
        finally:
            otel_context.detach(token)

    def _deliver(
        self, message: Message, matches: list[tuple[Conn, SubEntry]], publisher: str
    ) -> None:
        """One delivery per client: the highest QoS of its matching subscriptions
        [MQTT-3.3.4-2], all their subscription identifiers, no echo for no-local ones."""
        now = time.time()
        pub_qos = message.qos
        retained = message.retain
        if len(matches) == 1:
            conn, e = matches[0]
            if not (e.no_local and conn.channel.client_id == publisher):
                self._deliver_one(
                    conn,
                    message,
                    min(pub_qos, e.qos),
                    retained and e.retain_as_published,
                    e.sub_ids,
                    now,
                )
            return
        per_conn: dict[Conn, tuple[int, bool, tuple[int, ...]]] = {}
        for conn, e in matches:
            if e.no_local and conn.channel.client_id == publisher:
                continue
            q = min(pub_qos, e.qos)
            rap = retained and e.retain_as_published
            agg = per_conn.get(conn)
            if agg is not None:
                q, rap = max(agg[0], q), agg[1] or rap
                per_conn[conn] = (q, rap, agg[2] + e.sub_ids)
            else:
                per_conn[conn] = (q, rap, e.sub_ids)
        for conn, (q, rap, ids) in per_conn.items():
            self._deliver_one(conn, message, q, rap, ids, now)

    def _deliver_one(
        self,
        conn: Conn,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
    ) -> None:
        if qos and conn.persistent is not None:
            return  # a persistent session takes QoS>=1 only from its queue
        conn.channel.deliver(message, qos, retain, sub_ids, now)
        if conn.channel.out:
            self._mark_dirty(conn)

    async def _on_shared(self, group: SharedGroup[Conn], msg: Msg) -> None:
        hops = int(msg.headers.get(HOPS_HEADER, "0")) if msg.headers else 0
        for env in RoutedBatch.FromString(msg.data).messages:
            self._deliver_shared(group, env, hops)

    def _deliver_shared(self, group: SharedGroup[Conn], env: RoutedMessage, hops: int = 0) -> None:
        """One member gets it: the next one, in rotation, that has free inflight credit, or
        the one with the most if none has any, so no member is flooded while another idles
        and every member gets a share. Shared deliveries bypass the queue of a persistent
        member: only connected members receive."""
        members = [(c, e) for c, e in group.members.items() if c.channel.state is State.CONNECTED]
        if not members:
            return
        group.turn += 1
        n = len(members)

        def credit(i: int) -> int:
            ob = members[i][0].channel.outbound
            return ob.receive_maximum - len(ob.inflight) - len(ob.pending or ())

        order = [(group.turn + k) % n for k in range(n)]
        chosen = next((i for i in order if credit(i) > 0), None)
        if chosen is None:
            chosen = max(order, key=credit)
        conn, e = members[chosen]
        message = from_envelope(env)
        qos = min(message.qos, e.qos)
        ob = conn.channel.outbound
        if qos and ob.pending and len(ob.pending) >= ob.max_queued and hops < MAX_SHARED_HOPS:
            # Every member here is saturated: give it back to the group so NATS can pick
            # another node, instead of overflowing this member's queue (a drop).
            self._spawn(self._republish_shared([(redelivery_subject(group), env)], hops + 1))
            return
        origin = (redelivery_subject(group), env) if qos else None
        ob.deliver(message, qos, False, e.sub_ids, time.time(), origin)
        if conn.channel.out:
            self._mark_dirty(conn)

    # ---- subscriptions -------------------------------------------------------------------

    def _subscribe(
        self, conn: Conn, req: SubscribeRequest, persist: bool = False, answer: bool = True
    ) -> None:
        """Add to the node's trie now; NATS subscriptions, the router (for a persistent
        session's new subscriptions) and the SUBACK follow in order on the control task."""
        tenant = conn.channel.tenant
        new_subjects: list[str] = []
        new_groups: list[SharedGroup[Conn]] = []
        for s, sub_id in req.subscriptions:
            shared = parse_shared(s.filter)
            if shared is None:
                entry = entry_for(
                    s.filter, tenant, s.qos, s.no_local, s.retain_as_published, sub_id
                )
                new_subjects += self.subs.add(tenant, conn, entry)
            else:
                entry = entry_for(shared.filter, tenant, s.qos, False, False, sub_id)
                g = self.subs.add_shared(tenant, shared.group, conn, entry)
                if g is not None:
                    new_groups.append(g)

        async def op() -> None:
            try:
                await self._add_nats_subscriptions(new_subjects, new_groups)
            except Exception:  # answer the client anyway: these subscriptions failed
                log.exception("nats_subscribe_failed")
                self._unsubscribe(conn, tuple(s.filter for s, _ in req.subscriptions))
                if answer:
                    codes = tuple(0x80 if c < 0x80 else c for c in req.reason_codes)
                    conn.channel.on_subscribed(SubscribeRequest(req.packet_id, (), codes))
                    self._mark_dirty(conn)
                return
            final = req
            if persist and req.subscriptions:
                final = await self._persist_subscriptions(conn, req)
            if answer:
                conn.channel.on_subscribed(final)
                self._mark_dirty(conn)
                await self._send_retained(conn, final)

        self._ctl_queue.put_nowait(op)

    async def _send_retained(self, conn: Conn, req: SubscribeRequest) -> None:
        """Retained messages for new subscriptions, after the SUBACK, by retain handling:
        0 always, 1 only for a subscription that did not exist, 2 never; none for shared
        subscriptions. A persistent session gets them through its queue."""
        if self.router is None or conn.closed:
            return
        ch = conn.channel
        fresh = req.fresh or (True,) * len(req.subscriptions)
        for (s, sub_id), is_new in zip(req.subscriptions, fresh, strict=True):
            if parse_shared(s.filter) is not None or s.retain_handling == 2:
                continue
            if s.retain_handling == 1 and not is_new:
                continue
            try:
                if conn.persistent is not None:
                    await self.router.get_retained(
                        ch.tenant, s.filter, conn.persistent.queue_id, s.qos, sub_id or 0
                    )
                    continue
                found = await self.router.get_retained(ch.tenant, s.filter)
            except Exception as exc:
                log.warning("retained_lookup_failed", extra={"error": type(exc).__name__})
                continue
            now = time.time()
            ids = (sub_id,) if sub_id else ()
            for env in found:
                m = from_envelope(env)
                ch.deliver(m, min(m.qos, s.qos), True, ids, now)  # [MQTT-3.3.1-8]
            self._mark_dirty(conn)

    async def _add_nats_subscriptions(
        self, new_subjects: list[str], new_groups: list[SharedGroup[Conn]]
    ) -> None:
        for subject in new_subjects:
            await self._nats_subscribe(subject)
        for g in new_groups:
            # nats-py needs a coroutine function as callback (a lambda is refused).
            async def on_shared(msg: Msg, g: SharedGroup[Conn] = g) -> None:
                await self._on_shared(g, msg)

            for subject in (*g.subjects, redelivery_subject(g)):
                key = f"{g.queue}|{subject}"
                self._nats_subs[key] = await self.nc_shared.subscribe(
                    subject, queue=g.queue, cb=on_shared
                )
        if new_subjects:
            await self.nc.flush(timeout=5)
        if new_groups:
            await self.nc_shared.flush(timeout=5)

    async def _persist_subscriptions(self, conn: Conn, req: SubscribeRequest) -> SubscribeRequest:
        """Store a persistent session's new subscriptions in the router before the SUBACK;
        if the router cannot take them, answer 0x80 for them instead."""
        ch = conn.channel
        subs = [
            router_pb2.PersistentSubscription(
                topic_filter=s.filter,
                qos=s.qos,
                no_local=s.no_local,
                retain_as_published=s.retain_as_published,
                retain_handling=s.retain_handling,
                subscription_identifier=sub_id or 0,
            )
            for s, sub_id in req.subscriptions
        ]
        try:
            assert self.router is not None
            await self.router.subscribe(ch.tenant, ch.client_id, ch.incarnation, subs)
            return req
        except Exception as exc:
            log.warning("persistent_subscribe_failed", extra={"error": type(exc).__name__})
            self._unsubscribe(conn, tuple(s.filter for s, _ in req.subscriptions))
            codes = tuple(0x80 if c < 0x80 else c for c in req.reason_codes)
            return SubscribeRequest(req.packet_id, (), codes)

    async def _nats_subscribe(self, subject: str) -> None:
        async def cb(msg: Msg, subject: str = subject) -> None:
            await self._on_mesh(msg, subject)

        self._nats_subs[subject] = await self.nc.subscribe(subject, cb=cb)

    def _unsubscribe(self, conn: Conn, filters: tuple[str, ...], persist: bool = False) -> None:
        """Remove from the node; `persist`: also from the session's stored subscriptions."""
        tenant = conn.channel.tenant
        if persist and self.router is not None:
            ch = conn.channel
            router = self.router

            async def forget() -> None:
                try:
                    await router.unsubscribe(ch.tenant, ch.client_id, ch.incarnation, list(filters))
                except Exception as exc:
                    log.warning(
                        "persistent_unsubscribe_failed", extra={"error": type(exc).__name__}
                    )

            self._ctl_queue.put_nowait(forget)
        gone: list[str] = []
        for f in filters:
            shared = parse_shared(f)
            if shared is None:
                gone += self.subs.remove(tenant, conn, f)
            else:
                g = self.subs.remove_shared(tenant, shared.group, conn, shared.filter)
                if g is not None:
                    gone += [f"{g.queue}|{s}" for s in (*g.subjects, redelivery_subject(g))]
        if gone:

            async def op() -> None:
                for key in gone:
                    sub = self._nats_subs.pop(key, None)
                    if sub is not None:
                        await sub.unsubscribe()

            self._ctl_queue.put_nowait(op)

    async def _controller(self) -> None:
        while True:
            op = await self._ctl_queue.get()
            try:
                await op()
            except Exception:
                log.exception("subscription_op_failed")

    # ---- connect, takeover, close ---------------------------------------------------------

    async def _authenticate(self, conn: Conn, action: Authenticate) -> None:
        ch = conn.channel
        p = action.connect
        req = session_pb2.ConnectRequest(
            username=p.username or "",
            client_id=action.client_id,
            node_id=self.node_id,
            peer_address=ch.peer,
            protocol_level=p.protocol_level,
            clean_start=p.clean_start,
            session_expiry_interval_s=requested_session_expiry(p),
        )
        if p.password is not None:
            req.password = p.password
        taken_over = False
        try:
            with tracer.start_as_current_span(
                "mqtt.connect",
                attributes={"starling.node": self.node_id, "mqtt.client_id": action.client_id},
            ):
                resp = await self.session.connect(req)
        except Exception as exc:
            log.warning("session_unavailable", extra={"error": str(exc)})
            result = AuthResult(False, RC.SERVER_UNAVAILABLE)
        else:
            if resp.result == session_pb2.CONNECT_RESULT_OK or (
                resp.result == session_pb2.CONNECT_RESULT_TAKEN_OVER
            ):
                key = (resp.tenant, action.client_id)
                tomb = self._tombstones.get(key)
                taken_over = resp.result == session_pb2.CONNECT_RESULT_TAKEN_OVER or (
                    tomb is not None and tomb[0] >= resp.epoch
                )
                result = AuthResult(
                    True,
                    0,
                    resp.tenant,
                    resp.epoch,
                    resp.session_present,
                    tuple(
                        AclRule(
                            r.permission == session_pb2.PERMISSION_ALLOW,
                            Access(r.action),
                            r.topic_filter,
                        )
                        for r in resp.acl
                    ),
                    resp.acl_default != session_pb2.PERMISSION_DENY,
                    resp.incarnation,
                    resp.session_expiry_interval_s,
                    tuple(
                        (
                            Subscription(
                                s.topic_filter,
                                s.qos,
                                s.no_local,
                                s.retain_as_published,
                                s.retain_handling,
                            ),
                            s.subscription_identifier or None,
                        )
                        for s in resp.subscriptions
                    ),
                )
            else:
                result = AuthResult(False, _CONNECT_CODES.get(resp.result, RC.NOT_AUTHORIZED))
        if conn.closed:
            if result.ok:  # the client left while we asked: release the registry entry
                self._spawn(
                    self._release(
                        result.tenant, action.client_id, result.epoch, result.incarnation, None
                    )
                )
            return
        ch.on_authenticated(result, time.time())
        if ch.state is State.CONNECTED:
            conn.registered = True
            self.clients.setdefault((ch.tenant, ch.client_id), {})[ch.epoch] = conn
            if taken_over:
                ch.disconnect(RC.SESSION_TAKEN_OVER, "a newer connection took the session")
            else:
                self._spawn(self._settle_will(ch.tenant, ch.client_id, result.session_present))
                if ch.persistent:
                    self._resume(conn, result)
        self.after(conn)

    def _resume(self, conn: Conn, result: AuthResult) -> None:
        """A persistent session: restore its subscriptions here, deliver its queue."""
        ch = conn.channel
        if result.subscriptions:
            self._subscribe(conn, SubscribeRequest(0, result.subscriptions, ()), answer=False)
        if self.queue is None:
            return
        conn.persistent = PersistentDelivery(
            conn,
            self.queue,
            self.nc_shared,
            ch.tenant,
            queue_id(ch.client_id, ch.incarnation),
            result.session_present,
            time.time,
        )
        persistent = conn.persistent

        async def start() -> None:
            await persistent.start()

        self._ctl_queue.put_nowait(start)

    async def _on_routes(self, msg: Msg) -> None:
        """The router's ListRoutes asks every node which filters its clients hold."""
        tenant = msg.data.decode()
        trie = self.subs.tries.get(tenant)
        filters = sorted({f for f, _, _ in trie.items()}) if trie is not None else []
        filters += sorted(
            {
                f"$share/{g.group}/{g.filter}"
                for (t, _, _), g in self.subs.shared.items()
                if t == tenant
            }
        )
        reply = router_pb2.ListRoutesResponse(
            routes=[router_pb2.Route(topic_filter=f, node_ids=[self.node_id]) for f in filters]
        )
        if msg.reply:
            await self.nc.publish(msg.reply, reply.SerializeToString())

    async def _on_control(self, msg: Msg) -> None:
        kick = connection_pb2.Kick.FromString(msg.data)
        key = (kick.tenant, kick.client_id)
        now = time.monotonic()
        prev = self._tombstones.get(key)
        if prev is None or prev[0] < kick.epoch:
            self._tombstones[key] = (kick.epoch, now)
        for epoch, conn in list(self.clients.get(key, {}).items()):
            if kick.epoch == 0 or epoch <= kick.epoch:
                conn.channel.disconnect(kick.reason_code or RC.ADMINISTRATIVE_ACTION, "kicked")
                self.after(conn)

    def cleanup(self, conn: Conn) -> None:
        """Exactly once per connection: forget its subscriptions, publish its will."""
        if conn.closed:
            return
        conn.closed = True
        self.conns.discard(conn)
        self._dirty.discard(conn)
        self._throttled.discard(conn)
        ch = conn.channel
        ch.connection_lost()
        leftovers = ch.outbound.unacked_shared()
        if ch.subscriptions:
            self._unsubscribe(conn, tuple(ch.subscriptions))
        if leftovers:
            self._ctl_queue.put_nowait(lambda: self._redeliver(leftovers))
        if conn.persistent is not None:
            self._spawn(conn.persistent.close())
        if not conn.registered:
            return
        c = self._counters(ch.tenant)
        c.messages_out += ch.outbound.sent
        c.dropped += ch.outbound.dropped
        key = (ch.tenant, ch.client_id)
        held = self.clients.get(key)
        if held is not None:
            held.pop(ch.epoch, None)
            if not held:
                del self.clients[key]
        if ch.will is not None and not ch.normal_disconnect:
            self._publish_will(ch)
        self._spawn(
            self._release(ch.tenant, ch.client_id, ch.epoch, ch.incarnation, ch.disconnect_expiry_s)
        )

    def _publish_will(self, ch: Channel) -> None:
        """The connection ended without a normal DISCONNECT: publish the will now, or, with
        a Will Delay Interval, hand it to the router to publish after min(delay, session
        expiry) unless the client connects again first [MQTT-3.1.3-9]."""
        w = ch.will
        if w is None or not ch.acl.can_publish(w.topic):
            return
        now = time.time()
        mei = w.properties.message_expiry_interval
        msg = Message(
            ch.tenant,
            w.topic,
            w.payload,
            w.qos,
            w.retain,
            ch.client_id,
            message_properties(w.properties),
            now + mei if mei is not None else None,
            now,
        )
        expiry = (
            ch.disconnect_expiry_s if ch.disconnect_expiry_s is not None else (ch.session_expiry_s)
        )
        delay = min(w.properties.will_delay_interval or 0, expiry)
        if delay and self.routing is not None:
            env = to_envelope(msg, self.node_id, f"{self.node_id}-{next(self._ids)}")
            env.delay_s = delay
            self.routing.submit(None, 0, env)
            return
        self.route([msg])

    async def _settle_will(self, tenant: str, client_id: str, resumed: bool) -> None:
        """A client connected: a delayed will of its previous connection is cancelled if the
        session was resumed, published now if the old session ended (clean start)."""
        if self.router is None:
            return
        try:
            await self.router.settle_will(tenant, client_id, publish_now=not resumed)
        except Exception as exc:
            log.warning("settle_will_failed", extra={"error": type(exc).__name__})

    async def _redeliver(self, leftovers: list[object]) -> None:
        """A shared-subscription member left with unacknowledged messages: hand each to
        another member of its group (queued after this node dropped the member, so NATS
        picks among the remaining ones)."""
        await self._republish_shared(leftovers, 0)  # type: ignore[arg-type]
        log.info("shared_redelivered", extra={"messages": len(leftovers)})

    async def _republish_shared(self, items: list[tuple[str, RoutedMessage]], hops: int) -> None:
        """Publish messages on their group's redelivery subject; one member gets each."""
        headers = {HOPS_HEADER: str(hops)} if hops else None
        for subject, env in items:
            batch = RoutedBatch()
            batch.messages.append(env)
            await self.nc_shared.publish(subject, batch.SerializeToString(), headers=headers)

    async def _release(
        self, tenant: str, client_id: str, epoch: int, incarnation: int, expiry_s: int | None
    ) -> None:
        try:
            await self.session.disconnect(
                tenant, client_id, epoch, self.node_id, incarnation, expiry_s
            )
        except Exception as exc:
            log.warning("session_release_failed", extra={"error": str(exc)})

    async def _sweeper(self) -> None:
        """Keep alive and CONNECT timeouts; a poll of persistent queues every second, for
        notices missed while the queue service was away."""
        rounds = 0
        while True:
            await asyncio.sleep(0.5)
            rounds += 1
            now = time.time()
            for conn in list(self.conns):
                ch = conn.channel
                ch.tick(now)
                if ch.actions or ch.out:
                    self.after(conn)
                if rounds % 2 == 0 and conn.persistent is not None:
                    conn.persistent.poll()
            if rounds % 2 == 0:
                try:
                    await self.nc.publish(
                        subjects.node_heartbeat(self.node_id), self.node_id.encode()
                    )
                except Exception:  # NATS away: the session service will notice
                    log.warning("heartbeat_failed")
            cutoff = time.monotonic() - 60
            for key in [k for k, (_, at) in self._tombstones.items() if at < cutoff]:
                del self._tombstones[key]

    def connections_by_tenant(self) -> dict[str, int]:
        """Open connections per tenant ("" for those not yet authenticated)."""
        out: dict[str, int] = {}
        for conn in list(self.conns):
            t = conn.channel.tenant
            out[t] = out.get(t, 0) + 1
        return out

    def tenant_stats(self) -> dict[str, TenantCounters]:
        """Per tenant: closed connections' totals plus the live ones' counters."""
        out = {
            t: TenantCounters(c.messages_in, c.messages_out, c.dropped)
            for t, c in self.counters.items()
        }
        for conn in list(self.conns):
            ch = conn.channel
            if not ch.tenant:
                continue
            t = out.setdefault(ch.tenant, TenantCounters())
            t.messages_out += ch.outbound.sent
            t.dropped += ch.outbound.dropped
        return out

    def _counters(self, tenant: str) -> TenantCounters:
        c = self.counters.get(tenant)
        if c is None:
            c = self.counters[tenant] = TenantCounters()
        return c
