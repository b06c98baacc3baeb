"""A connection node: binds channels to transports, the mesh (NATS) and the session service.

Theory of operation:
- `Conn.receive` feeds bytes to the channel, then `Node.after` carries out what the channel
  produced: bytes to the socket, messages to NATS (through one FIFO publisher task, so a
  client's publishes keep their order), and actions (authenticate, subscribe, close).
- Every NATS subscription (normal or shared) lands in `_on_mesh`, which matches the tenant's
  trie once and delivers to each matching client once. Writes are batched: channels are
  marked dirty and flushed together once per loop iteration.
- NATS subscribe/unsubscribe operations run in order on one control task; the SUBACK of a
  SUBSCRIBE is written after its NATS subscriptions are confirmed by a flush.
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
from services.connection.channel import Channel, ChannelConfig, State
from services.connection.envelope import from_envelope, to_envelope
from services.connection.subscriptions import (
    NodeSubscriptions,
    SharedGroup,
    SubEntry,
    entry_for,
    should_process,
)
from starling.common.v1.message_pb2 import RoutedMessage
from starling.connection.v1 import connection_pb2
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


class SessionPort(Protocol):
    async def connect(self, request: session_pb2.ConnectRequest
                      ) -> session_pb2.ConnectResponse: ...

    async def disconnect(self, tenant: str, client_id: str, epoch: int, node_id: str
                         ) -> bool: ...


@dataclass(slots=True)
class TenantCounters:
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0


class Conn:
    __slots__ = ("channel", "closed", "node", "registered", "sink")

    def __init__(self, node: Node, channel: Channel, sink: Sink) -> None:
        self.node = node
        self.channel = channel
        self.sink = sink
        self.closed = False
        self.registered = False

    def receive(self, data: bytes) -> None:
        ch = self.channel
        ch.receive(data, time.time())
        if ch.out or ch.publishes or ch.actions:
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
    def __init__(self, config: ChannelConfig, nc: Client, session: SessionPort,
                 tracing: bool = False) -> None:
        self.config = config
        self.node_id = config.node_id
        self.nc = nc
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
        self._pub_queue: list[tuple[str, bytes, dict[str, str] | None]] = []
        self._pub_wake = asyncio.Event()
        self._ctl_queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._ids = itertools.count(1)
        self._ctl_sub: NatsSubscription | None = None
        self._loop = asyncio.get_event_loop()

    # ---- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ctl_sub = await self.nc.subscribe(subjects.node_control(self.node_id),
                                                cb=self._on_control)
        self._workers = [
            asyncio.create_task(self._publisher(), name="node-publisher"),
            asyncio.create_task(self._controller(), name="node-controller"),
            asyncio.create_task(self._sweeper(), name="node-sweeper"),
        ]

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """Tell every client 0x8B, publish their wills, drain the mesh."""
        for conn in list(self.conns):
            conn.channel.disconnect(RC.SERVER_SHUTTING_DOWN, "server shutting down")
            self.after(conn)
        deadline = time.monotonic() + grace_s
        while (self._pub_queue or not self._ctl_queue.empty()) and time.monotonic() < deadline:
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
        if ch.publishes:
            msgs = ch.publishes
            ch.publishes = []
            self.route(msgs)
        if ch.actions:
            actions = ch.actions
            ch.actions = []
            for action in actions:
                if type(action) is SubscribeRequest:
                    self._subscribe(conn, action)
                elif type(action) is Unsubscribed:
                    self._unsubscribe(conn, action.filters)
                elif type(action) is Authenticate:
                    self._spawn(self._authenticate(conn, action))
                elif type(action) is Close:
                    conn.flush()
                    conn.sink.close()
                    self.cleanup(conn)
        if ch.out and not conn.closed:
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

    def route(self, msgs: list[Message]) -> None:
        queue = self._pub_queue
        counters = self._counters(msgs[0].tenant)
        for msg in msgs:
            counters.messages_in += 1
            headers = None
            if self.tracing:
                with tracer.start_as_current_span(
                    "mqtt.publish", kind=trace.SpanKind.PRODUCER,
                    attributes={"mqtt.topic": msg.topic, "starling.node": self.node_id,
                                "starling.tenant": msg.tenant, "mqtt.qos": msg.qos},
                ):
                    carrier = inject()
                if carrier:
                    headers = carrier
            env = to_envelope(msg, self.node_id, f"{self.node_id}-{next(self._ids)}")
            if headers:
                env.trace_context.update(headers)
            queue.append((topic_to_subject(msg.tenant, msg.topic), env.SerializeToString(),
                          None))
        self._pub_wake.set()

    async def _publisher(self) -> None:
        nc = self.nc
        while True:
            await self._pub_wake.wait()
            self._pub_wake.clear()
            batch = self._pub_queue
            self._pub_queue = []
            for subject, data, headers in batch:
                try:
                    await nc.publish(subject, data, headers=headers)
                except Exception:
                    log.exception("mesh_publish_failed", extra={"subject": subject})

    # ---- delivering from the mesh -------------------------------------------------------

    async def _on_mesh(self, msg: Msg, received_on: str) -> None:
        env = RoutedMessage.FromString(msg.data)
        trie = self.subs.tries.get(env.tenant)
        if trie is None:
            return
        matches = trie.match(env.topic)
        if not matches or (len(matches) > 1
                           and not should_process(received_on, msg.subject, matches)):
            return
        message = from_envelope(env)
        if message.trace_context and self.tracing:
            token = otel_context.attach(extract(dict(message.trace_context)))
            try:
                with tracer.start_as_current_span(
                    "mqtt.deliver", kind=trace.SpanKind.CONSUMER,
                    attributes={"mqtt.topic": env.topic, "starling.node": self.node_id,
                                "starling.tenant": env.tenant, "mqtt.recipients": len(matches)},
                ):
                    self._deliver(message, matches, env.publisher.client_id)
            finally:
                otel_context.detach(token)
        else:
            self._deliver(message, matches, env.publisher.client_id)

    def _deliver(self, message: Message, matches: list[tuple[Conn, SubEntry]],
                 publisher: str) -> None:
        """One delivery per client: the highest QoS of its matching subscriptions
        [MQTT-3.3.4-2], all their subscription identifiers, no echo for no-local ones."""
        now = time.time()
        pub_qos = message.qos
        retained = message.retain
        counters = self._counters(message.tenant)
        if len(matches) == 1:
            conn, e = matches[0]
            if not (e.no_local and conn.channel.client_id == publisher):
                self._deliver_one(conn, message, min(pub_qos, e.qos),
                                  retained and e.retain_as_published, e.sub_ids, now, counters)
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
            self._deliver_one(conn, message, q, rap, ids, now, counters)

    def _deliver_one(self, conn: Conn, message: Message, qos: int, retain: bool,
                     sub_ids: tuple[int, ...], now: float, counters: TenantCounters) -> None:
        ob = conn.channel.outbound
        sent, dropped = ob.sent, ob.dropped
        conn.channel.deliver(message, qos, retain, sub_ids, now)
        counters.messages_out += ob.sent - sent
        counters.dropped += ob.dropped - dropped
        if conn.channel.out:
            self._mark_dirty(conn)

    async def _on_shared(self, group: SharedGroup[Conn], msg: Msg) -> None:
        env = RoutedMessage.FromString(msg.data)
        members = [(c, e) for c, e in group.members.items()
                   if c.channel.state is State.CONNECTED]
        if not members:
            return
        # Prefer the member with the most free inflight credit; rotate among equals.
        group.turn += 1
        n = len(members)
        best = max(range(n), key=lambda i: (
            members[(i + group.turn) % n][0].channel.outbound.receive_maximum
            - len(members[(i + group.turn) % n][0].channel.outbound.inflight),
            -i))
        conn, e = members[(best + group.turn) % n]
        message = from_envelope(env)
        self._deliver_one(conn, message, min(message.qos, e.qos), False, e.sub_ids,
                          time.time(), self._counters(message.tenant))

    # ---- subscriptions -------------------------------------------------------------------

    def _subscribe(self, conn: Conn, req: SubscribeRequest) -> None:
        tenant = conn.channel.tenant
        new_subjects: list[str] = []
        new_groups: list[SharedGroup[Conn]] = []
        for s, sub_id in req.subscriptions:
            shared = parse_shared(s.filter)
            if shared is None:
                entry = entry_for(s.filter, tenant, s.qos, s.no_local, s.retain_as_published,
                                  sub_id)
                new_subjects += self.subs.add(tenant, conn, entry)
            else:
                entry = entry_for(shared.filter, tenant, s.qos, False, False, sub_id)
                g = self.subs.add_shared(tenant, shared.group, conn, entry)
                if g is not None:
                    new_groups.append(g)

        async def op() -> None:
            for subject in new_subjects:
                await self._nats_subscribe(subject)
            for g in new_groups:
                for subject in g.subjects:
                    key = f"{g.queue}|{subject}"
                    self._nats_subs[key] = await self.nc.subscribe(
                        subject, queue=g.queue, cb=lambda m, g=g: self._on_shared(g, m))
            if new_subjects or new_groups:
                await self.nc.flush(timeout=5)
            conn.channel.on_subscribed(req)
            self._mark_dirty(conn)

        self._ctl_queue.put_nowait(op)

    async def _nats_subscribe(self, subject: str) -> None:
        async def cb(msg: Msg, subject: str = subject) -> None:
            await self._on_mesh(msg, subject)

        self._nats_subs[subject] = await self.nc.subscribe(subject, cb=cb)

    def _unsubscribe(self, conn: Conn, filters: tuple[str, ...]) -> None:
        tenant = conn.channel.tenant
        gone: list[str] = []
        for f in filters:
            shared = parse_shared(f)
            if shared is None:
                gone += self.subs.remove(tenant, conn, f)
            else:
                g = self.subs.remove_shared(tenant, shared.group, conn, shared.filter)
                if g is not None:
                    gone += [f"{g.queue}|{s}" for s in g.subjects]
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
            username=p.username or "", client_id=action.client_id, node_id=self.node_id,
            peer_address=ch.peer, protocol_level=p.protocol_level, clean_start=p.clean_start)
        if p.password is not None:
            req.password = p.password
        taken_over = False
        try:
            with tracer.start_as_current_span("mqtt.connect", attributes={
                    "starling.node": self.node_id, "mqtt.client_id": action.client_id}):
                resp = await self.session.connect(req)
        except Exception as exc:
            log.warning("session_unavailable", extra={"error": str(exc)})
            result = AuthResult(False, RC.SERVER_UNAVAILABLE)
        else:
            if resp.result == session_pb2.CONNECT_RESULT_OK or (
                    resp.result == session_pb2.CONNECT_RESULT_TAKEN_OVER):
                key = (resp.tenant, action.client_id)
                tomb = self._tombstones.get(key)
                taken_over = resp.result == session_pb2.CONNECT_RESULT_TAKEN_OVER or (
                    tomb is not None and tomb[0] >= resp.epoch)
                result = AuthResult(
                    True, 0, resp.tenant, resp.epoch, resp.session_present,
                    tuple(AclRule(r.permission == session_pb2.PERMISSION_ALLOW,
                                  Access(r.action), r.topic_filter) for r in resp.acl),
                    resp.acl_default != session_pb2.PERMISSION_DENY)
            else:
                result = AuthResult(False, _CONNECT_CODES.get(resp.result, RC.NOT_AUTHORIZED))
        if conn.closed:
            if result.ok:  # the client left while we asked: release the registry entry
                self._spawn(self._release(result.tenant, action.client_id, result.epoch))
            return
        ch.on_authenticated(result, time.time())
        if ch.state is State.CONNECTED:
            conn.registered = True
            self.clients.setdefault((ch.tenant, ch.client_id), {})[ch.epoch] = conn
            if taken_over:
                ch.disconnect(RC.SESSION_TAKEN_OVER, "a newer connection took the session")
        self.after(conn)

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
        ch = conn.channel
        ch.connection_lost()
        if ch.subscriptions:
            self._unsubscribe(conn, tuple(ch.subscriptions))
        if not conn.registered:
            return
        key = (ch.tenant, ch.client_id)
        held = self.clients.get(key)
        if held is not None:
            held.pop(ch.epoch, None)
            if not held:
                del self.clients[key]
        if ch.will is not None and not ch.normal_disconnect:
            w = ch.will
            if ch.acl.can_publish(w.topic):
                now = time.time()
                mei = w.properties.message_expiry_interval
                self.route([Message(ch.tenant, w.topic, w.payload, w.qos, w.retain,
                                    ch.client_id, message_properties(w.properties),
                                    now + mei if mei is not None else None, now)])
        self._spawn(self._release(ch.tenant, ch.client_id, ch.epoch))

    async def _release(self, tenant: str, client_id: str, epoch: int) -> None:
        try:
            await self.session.disconnect(tenant, client_id, epoch, self.node_id)
        except Exception as exc:
            log.warning("session_release_failed", extra={"error": str(exc)})

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for conn in list(self.conns):
                ch = conn.channel
                ch.tick(now)
                if ch.actions or ch.out:
                    self.after(conn)
            cutoff = time.monotonic() - 60
            for key in [k for k, (_, at) in self._tombstones.items() if at < cutoff]:
                del self._tombstones[key]

    def _counters(self, tenant: str) -> TenantCounters:
        c = self.counters.get(tenant)
        if c is None:
            c = self.counters[tenant] = TenantCounters()
        return c

    def client_drops(self) -> dict[tuple[str, str], int]:
        """Dropped deliveries per connected (tenant, client id)."""
        return {(c.channel.tenant, c.channel.client_id): c.channel.outbound.dropped
                for c in self.conns if c.channel.outbound.dropped}
