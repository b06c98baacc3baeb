"""A connection node: the composition root that wires the modules that own its behaviours.

Who owns what (docs/architecture.md has the full map):
- `conn.Conn` one connection (channel + transport); `listener` the sockets; `linger` how
  they close; `writes` batched writes; `registry` connections by client id and kick
  tombstones; `admission` connections per peer address;
- `ingress` a client's publishes (local fan-out, NATS batch, router); `mesh` batching onto
  NATS; `fanout` delivery to this node's clients; `shared` shared-subscription dispatch;
  `flow` back-pressure; `routing` the router pipeline that releases PUBACK/PUBREC;
- `subscribing` SUBSCRIBE/UNSUBSCRIBE; `retained` retained replay; `session_link`
  authenticate, resume, takeover, release; `persistence` a persistent session's queue;
  `wills` wills; `sweeper` timers and heartbeats; `stats` counters and their export.

The channel (services/connection/channel/) is sans-I/O: it returns actions and `carry_out`
hands each to its owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from nats.aio.client import Client

from services.common.bans import BanList
from services.common.bus import subjects
from services.common.bus.ids import MessageIds
from services.common.bus.large import Fetcher, Holder
from services.common.connect import WILL_STORE_MAX_BYTES
from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals
from services.common.rpc.limits import max_message_bytes
from services.common.tasks import TaskSet
from services.connection.admission import PerAddress
from services.connection.channel import (
    Action,
    Authenticate,
    AutoSubscribe,
    Channel,
    ChannelConfig,
    Close,
    DeliveryProgress,
    Reauthenticate,
    ReleaseQos2,
    Route,
    SubscribeRequest,
    Unsubscribed,
)
from services.connection.conn import Conn, Sink
from services.connection.events import SubscriptionEvents
from services.connection.exactly_once import ExactlyOnceInbound, Qos2Journal
from services.connection.fanout import Fanout
from services.connection.flow import FlowControl
from services.connection.ingress import Ingress
from services.connection.interest import MeshInterest
from services.connection.lease import NodeLease
from services.connection.linger import Linger
from services.connection.mesh import MeshPublisher
from services.connection.ordered import OrderedOps
from services.connection.peer_cert import PeerCert
from services.connection.quota import NodeQuota
from services.connection.registry import Registry
from services.connection.retained import RetainedReplay
from services.connection.routing import Router, RoutingPipeline
from services.connection.session_link import SessionLink
from services.connection.shared import Origin, SharedDispatch
from services.connection.stats import NodeStats
from services.connection.subscribing import Subscriber
from services.connection.subscriptions import NodeSubscriptions
from services.connection.sweeper import Sweeper
from services.connection.sys_events import SysEvents
from services.connection.wills import Wills
from services.connection.writes import WriteBatcher
from services.queue.client import QueueClient
from services.router.client import RouterClient, RouteResult
from services.rules.client import RuleFeed
from services.session.client import SessionClient

log = logging.getLogger("starling.connection")
# Large messages (over one NATS message) a node holds for other nodes to fetch, in units of
# the largest message: a few may be under way at once.
HOLD_MESSAGES = 4

# How long an ended connection's pending QoS 2 records may hold back its release and a
# takeover's kick reply (the session service waits 1 s for that reply).
QOS2_SETTLE_S = 0.8


def assigned_client_id() -> str:
    return "auto-" + uuid.uuid4().hex  # [MQTT-3.1.3-6]


_REFUSED = (RouteResult.QUOTA_EXCEEDED, RouteResult.QUEUE_QUOTA_EXCEEDED)


class Node:
    def __init__(
        self,
        config: ChannelConfig,
        nc: Client,
        session: SessionClient,
        tracing: bool = False,
        nc_shared: Client | None = None,
        router: RouterClient | None = None,
        queue: QueueClient | None = None,
        new_client_id: Callable[[], str] = assigned_client_id,
        max_connections_per_ip: int = 0,
        publish_router: Router | None = None,
        mesh_interest_window_s: float = 0.0,
        quota: NodeQuota | None = None,
        rule_feed: RuleFeed | None = None,
        will_store_max_bytes: int = WILL_STORE_MAX_BYTES,
        self_fence_s: float = 0.0,
        on_lease_change: Callable[[bool], None] | None = None,
    ) -> None:
        """`self_fence_s`: fence after that long without an answered heartbeat (lease.py;
        0: never). `publish_router`: what QoS>=1 publishes are routed by (services/connection/
        replica.py's CopyRouter); `router` by default. `quota`: the tenants' rate budgets
        (None: no rate limits). `rule_feed`: where QoS 0 messages the rules read go (QoS>=1
        ones go through `publish_router`, services/connection/rules_tap.py)."""
        self.config = config
        self.rule_feed = rule_feed
        self.node_id = config.node_id
        self.nc = nc  # connected with no_echo: our own mesh publishes never come back
        self.nc_shared = nc_shared or nc  # queue groups, so NATS picks among our members too
        self._new_client_id = new_client_id
        self._loop = asyncio.get_event_loop()
        self.tasks = TaskSet()
        self._workers = TaskSet()
        self.registry = Registry()
        self.per_address = PerAddress(max_connections_per_ip)
        self.refusals = Refusals()
        self.quota = quota
        self.stats = NodeStats(self.registry.conns, lambda: self.refusals)
        self.writes = WriteBatcher(self._loop)
        self.subs: NodeSubscriptions[Conn] = NodeSubscriptions()
        self.ops = OrderedOps()
        self.ids = MessageIds(self.node_id, time.time_ns())
        # Messages larger than one NATS message go by reference, held here for fetching.
        self.holder = Holder(self.node_id, HOLD_MESSAGES * max_message_bytes())
        self.mesh = MeshPublisher(nc, self.holder)
        # Which tenants other nodes listen to (0: unknown, publish everything on NATS).
        self.interest = MeshInterest(self.nc_shared, self.node_id, mesh_interest_window_s)
        self.qos2_journal = Qos2Journal(session)
        self.routing: RoutingPipeline[Conn] | None = (
            RoutingPipeline(
                publish_router or router,
                self._routed,
                self._routing_gave_up,
                on_acked=self.stats.acked,
            )
            if router
            else None
        )
        self._build_message_path(router, tracing)
        self.wills = Wills(
            self.node_id,
            self.ingress.publish,
            self.routing,
            router,
            self.ids,
            will_store_max_bytes,
        )
        self.sys_events = SysEvents(
            self.node_id,
            self.ingress.reaches,
            lambda msgs: self.ingress.publish(msgs, None, counted=False),
        )
        self.sessions = SessionLink(
            self.node_id,
            session,
            queue,
            self.nc_shared,
            self.registry,
            self.subscriber,
            self.wills,
            self.sys_events,
            self.ops,
            self.writes,
            self.tasks,
            self.carry_out,
            tracing,
        )
        # Ended connections whose QoS 2 records are still being written, by client.
        self._qos2_pending: dict[tuple[str, str], ExactlyOnceInbound] = {}
        self.sessions.settle_first = self._qos2_settled
        if rule_feed is not None:  # auto-subscriptions and subscription events (issue 17)
            self.sessions.auto_subscriptions = rule_feed.auto_subscriptions
            self.subscriber.events = SubscriptionEvents(self.nc, self.node_id, rule_feed.emits)
        self.lease = NodeLease(self, nc, self_fence_s, on_lease_change)
        self.sweeper = Sweeper(
            self.node_id, self.registry, nc, self.carry_out, self.mark_dirty, queue, self.lease
        )
        # Set while the node drains (services/connection/drain.py): the Server Reference a
        # CONNECT that still reaches it is refused with.
        self.drain_reference: str | None = None
        # How the listeners close sockets (linger.py); main.py sets it from the settings.
        self.linger = Linger()
        # How long a drain or shutdown waits for the acks a client is owed (close_ack_wait_s).
        self.ack_wait_s = 1.0

    def _build_message_path(self, router: RouterClient | None, tracing: bool) -> None:
        """Fan-out, shared dispatch, subscribing, flow control and ingress: the modules a
        message passes through."""
        node_id, routing = self.node_id, self.routing
        fanout = Fanout(node_id, self.subs, self.writes, tracing, Fetcher(self.nc))
        self.shared = SharedDispatch(
            self.nc_shared, self.writes, self.tasks, self.holder, Fetcher(self.nc_shared)
        )
        self.subscriber = Subscriber(
            node_id,
            self.subs,
            self.nc,
            self.nc_shared,
            self.ops,
            fanout,
            self.shared,
            RetainedReplay(router, self.writes),
            self.writes,
            router,
            self.interest,
        )
        self.flow = FlowControl(
            self._loop,
            lambda: self.mesh.queued,
            self.subscriber.inbound_backlog_bytes,
            lambda: len(routing) if routing is not None else 0,
        )
        self.ingress = Ingress(
            node_id,
            self.subs,
            self.mesh,
            fanout,
            self.flow,
            self.stats,
            routing,
            self.ids,
            tracing,
            self.interest,
            self.rule_feed,
        )

    # ---- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.writes.bind(loop)
        self.flow.bind(loop)
        await self.nc.subscribe(subjects.node_control(self.node_id), cb=self.sessions.on_kick)
        await self.nc.subscribe(subjects.REGISTRY_LOST, cb=self.sessions.on_registry_lost)
        await self.holder.start(self.nc)
        await self.subscriber.listen_for_route_listings()
        await self.interest.start()
        if self.quota is not None:
            await self.quota.start(self.nc)
        # Before any client connects: the session service releases what an earlier life
        # of this node id held (after a crash and restart).
        await self.nc.publish(subjects.node_hello(self.node_id), self.node_id.encode())
        await self.nc.flush(timeout=5)
        self._workers.spawn(self.mesh.run(), name="node-mesh-publisher")
        self._workers.spawn(self.ops.run(), name="node-ordered-ops")
        self._workers.spawn(self.sweeper.run(), name="node-sweeper")
        self._workers.spawn(self.qos2_journal.run(), name="node-qos2-journal")
        if self.routing is not None:
            self._workers.spawn(self.routing.run(), name="node-routing")

    def kick_banned(self, bans: BanList) -> None:
        """The ban list changed: disconnect every client it names now. DISCONNECT 0x98
        (Administrative action) with the ban's reason as Reason String: 0x8A (Banned) is a
        CONNACK code only, not allowed in DISCONNECT [MQTT-3.14.2.1] (paho calls it a
        protocol error); the client's next CONNECT gets CONNACK 0x8A."""
        if not len(bans):
            return
        now_ms = int(time.time() * 1000)
        for conn in list(self.registry.conns):
            ch = conn.channel
            if not conn.registered or conn.closed:
                continue
            name = ch.identity.partition("/")[2]
            ban = bans.match(ch.tenant, ch.client_id, name, ch.peer, now_ms)
            if ban is not None:
                self.refusals.count("banned", ch.tenant)
                why = f"banned: {ban.reason}" if ban.reason else "banned"
                self.carry_out(conn, ch.disconnect(RC.ADMINISTRATIVE_ACTION, why))

    def shed(self, reason: int, why: str) -> None:
        """Disconnect every client with `reason` (their wills follow as for any close)."""
        for conn in list(self.registry.conns):
            self.carry_out(conn, conn.channel.disconnect(reason, why))

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """Tell every client 0x8B once the acks it is owed are written, publish their wills,
        drain the mesh."""
        deadline = time.monotonic() + grace_s
        await self.answer_owed(list(self.registry.conns), min(self.ack_wait_s, grace_s / 2))
        self.shed(RC.SERVER_SHUTTING_DOWN, "shutdown")
        await self.settle(deadline - time.monotonic())

    async def answer_owed(self, conns: list[Conn], timeout_s: float) -> None:
        """Before closing `conns`: stop reading them, then wait (at most `timeout_s`) until
        the acks they are owed are written, so that no exchange the node finished is left
        unanswered (a PUBREL whose release was written, answered PUBCOMP 0x92 on the next
        node). Polled: it runs once, on the way out."""
        owing = []
        for conn in conns:
            if not conn.closed:
                conn.channel.stop_reading()
                if conn.channel.owes_acks:
                    owing.append(conn)
        deadline = time.monotonic() + timeout_s
        while owing and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            owing = [c for c in owing if not c.closed and c.channel.owes_acks]
        await self._workers.cancel()
        await self.interest.stop()
        if self.quota is not None:
            await self.quota.stop()
        try:
            await self.nc.flush(timeout=1)
        except Exception:
            log.warning("nats_flush_failed_on_shutdown")

    async def settle(self, grace_s: float) -> None:
        """Wait (at most `grace_s`) for what ended connections left under way: mesh
        publishes, ordered operations, session releases, wills and lingering closes."""
        deadline = time.monotonic() + grace_s
        # Polling is fine here: it runs once, on the way out, for at most `grace_s`. Lingering
        # sockets (linger.py) too: their clients read their DISCONNECT before the exit.
        while self._unsettled() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await self.tasks.wait(deadline - time.monotonic())

    def _unsettled(self) -> bool:
        return bool(self.mesh.queued or not self.ops.empty() or self.linger.count)

    def open(self, sink: Sink, peer: str, cert: PeerCert | None = None) -> Conn:
        now = time.time()
        gates = self.quota.gate if self.quota is not None else None
        channel = Channel(self.config, peer, now, self._new_client_id, self.refusals.count, gates)
        conn = Conn(self, channel, sink, cert)
        self.registry.opened(conn)
        self.sweeper.schedule(conn, now)  # CONNECT timeout: looked at from the next tick
        self.per_address.opened(peer)
        return conn

    # ---- what a channel asked for -------------------------------------------------------

    def carry_out(self, conn: Conn, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Route):
                if conn.channel.persistent:
                    self._exactly_once(conn).route(action.messages)
                else:
                    self.ingress.publish(action.messages, conn)
            elif isinstance(action, ReleaseQos2):
                self._release_qos2(conn, action.packet_id)
            elif isinstance(action, DeliveryProgress):
                if conn.persistent is not None:
                    conn.persistent.progress()
            elif isinstance(action, SubscribeRequest):
                self.subscriber.subscribe(conn, action, persist=conn.channel.persistent)
            elif isinstance(action, AutoSubscribe):
                self.subscriber.subscribe(
                    conn, action.request, persist=conn.channel.persistent, answer=False, auto=True
                )
            elif isinstance(action, Unsubscribed):
                self.subscriber.unsubscribe(
                    conn, action.filters, persist=conn.channel.persistent, announce=True
                )
            elif isinstance(action, Authenticate):
                self._admit(conn, action)
            elif isinstance(action, Reauthenticate):
                self.sessions.reauthenticate(conn, action)
            elif isinstance(action, Close):
                conn.flush()
                detaching = self.cleanup(conn)
                if detaching is None:
                    conn.sink.close()
                else:
                    # The socket closes once the queue reader detached (bounded): a message
                    # published after the client saw its connection end must reach its next
                    # connection as a first attempt (DUP=0), not be pushed to this one.
                    self.tasks.spawn(self._close_after(conn, detaching), name="close-after")
        if conn.channel.out and not conn.closed:
            self.writes.mark(conn)

    def mark_dirty(self, conn: Conn) -> None:
        if not conn.closed:
            self.writes.mark(conn)

    def sweep_at(self, conn: Conn, at: float) -> None:
        if not conn.closed:
            self.sweeper.schedule(conn, at)

    def cleanup(self, conn: Conn) -> asyncio.Task[None] | None:
        """Exactly once per connection: forget its subscriptions, publish its will, release
        its session. Returns the detach of its queue reader (a persistent session), if any."""
        if conn.closed:
            return None
        conn.closed = True
        self.registry.closed(conn, time.monotonic())
        self.sweeper.forget(conn)
        self.per_address.closed(conn.channel.peer)
        self.writes.discard(conn)
        self.flow.forget(conn)
        ch = conn.channel
        ch.connection_lost()
        leftovers: list[Origin] = ch.outbound.unacked_shared()  # type: ignore[assignment]
        if ch.subscriptions:
            self.subscriber.unsubscribe(conn, tuple(ch.subscriptions))
        if leftovers:
            self.ops.put(lambda: self.shared.redeliver(leftovers))
        closing = None
        if conn.persistent is not None:
            closing = self.tasks.spawn(conn.persistent.close(), name="persistent-close")
        if conn.exactly_once is not None:
            self.tasks.spawn(conn.exactly_once.ended(), name="qos2-ended")
        if not conn.registered:
            return closing
        self.stats.connection_ended(conn)
        self.wills.connection_ended(ch)
        self.sys_events.disconnected(ch)
        eo = conn.exactly_once
        if eo is not None and eo.busy:
            # Released only once its records are written: the next connection resumes a
            # session that knows every QoS 2 id this one took.
            self._qos2_pending[(ch.tenant, ch.client_id)] = eo  # before any kick reply
        elif closing is None:
            self.sessions.connection_ended(conn)
            return None
        self.tasks.spawn(self._release_when_settled(conn, eo, closing), name="release-wait")
        return closing

    @staticmethod
    async def _close_after(conn: Conn, detaching: asyncio.Task[None]) -> None:
        try:
            await asyncio.wait((detaching,), timeout=QOS2_SETTLE_S)
        finally:
            conn.sink.close()

    async def _release_when_settled(
        self, conn: Conn, eo: ExactlyOnceInbound | None, closing: asyncio.Task[None] | None
    ) -> None:
        """Release the session once this connection's queue reader has detached (so the
        queue pushes nothing more to it: entries published after the client is seen gone
        reach its next connection as first attempts, DUP=0) and its QoS 2 records are
        written. Each wait is bounded: a lost dependency delays the release, never blocks it."""
        key = (conn.channel.tenant, conn.channel.client_id)
        try:
            if closing is not None:
                await asyncio.wait((closing,), timeout=QOS2_SETTLE_S)
            if eo is not None and eo.busy:
                await eo.idle(QOS2_SETTLE_S)
        finally:
            if eo is not None and self._qos2_pending.get(key) is eo:
                del self._qos2_pending[key]
        self.sessions.connection_ended(conn)

    async def _qos2_settled(self, tenant: str, client_id: str) -> None:
        """Before a takeover's kick is answered: this client's QoS 2 records are written."""
        eo = self._qos2_pending.get((tenant, client_id))
        if eo is not None:
            await eo.idle(QOS2_SETTLE_S)

    def _admit(self, conn: Conn, action: Authenticate) -> None:
        """Authenticate the CONNECT unless its address holds too many connections here or
        the node drains (then: elsewhere, CONNACK 0x9C with the Server Reference)."""
        if self.drain_reference is not None:
            self.refusals.count("draining")
            ref = self.drain_reference
            self.carry_out(conn, conn.channel.disconnect(RC.USE_ANOTHER_SERVER, "draining", ref))
            return
        if self.lease.fenced:  # its right to hold clients lapsed (lease.py): at once, 0x88
            self.refusals.count("node_fenced")
            self.carry_out(conn, conn.channel.authenticated(self.lease.refusal(), time.time()))
            return
        refused = self.per_address.refusal(conn.channel.peer, time.monotonic())
        if refused is not None:
            self.refusals.count("connections_per_ip")
            self.carry_out(conn, conn.channel.authenticated(refused, time.time()))
            return
        self.sessions.authenticate(conn, action)

    # ---- QoS 2 of persistent sessions (exactly_once.py) ---------------------------------

    def _exactly_once(self, conn: Conn) -> ExactlyOnceInbound:
        eo = conn.exactly_once
        if eo is None:
            ch = conn.channel

            def failed() -> None:
                if not conn.closed:
                    why = "session state unavailable"
                    self.carry_out(conn, conn.channel.disconnect(RC.SERVER_BUSY, why))

            eo = conn.exactly_once = ExactlyOnceInbound(
                ch.tenant,
                ch.client_id,
                ch.incarnation,
                self.qos2_journal,
                self.ids.next,
                lambda msgs: self.ingress.publish(msgs, conn),
                lambda msg: self._store_only(conn, msg),
                failed,
                self.tasks,
                fence=ch.qos2_fence,
            )
        return eo

    def _store_only(self, conn: Conn, msg: Message) -> None:
        """A QoS 2 resend an earlier connection recorded: the router alone, under its
        recorded id (the queue keeps one copy)."""
        if self.routing is None:
            self.ingress.publish([msg], conn)
            return
        self.routing.submit(conn, msg.packet_id, to_envelope(msg, self.node_id, msg.message_id))

    def _release_qos2(self, conn: Conn, pid: int, code: int = -1) -> None:
        """Forget `pid` in the session's stored state, then PUBCOMP (or, with `code`, the
        PUBREC with an error that ends the exchange)."""

        def done() -> None:
            if conn.closed:
                return
            if code < 0:
                conn.channel.qos2_released(pid)
            else:
                conn.channel.publish_routed(pid, code)
            self.writes.mark(conn)

        self.tasks.spawn(self._exactly_once(conn).release(pid, done), name="qos2-release")

    # ---- answers of the router pipeline -------------------------------------------------

    def _routed(self, conn: Conn | None, pid: int, result: RouteResult) -> None:
        """The router stored a QoS>=1 publish: the publisher gets its PUBACK/PUBREC now
        (0x97 when the tenant's retained-message cap refused its retained part, or a
        subscriber's queue refused it by the tenant's max_queue_depth)."""
        if conn is not None and pid and conn.exactly_once is not None:
            conn.exactly_once.routed(pid)
        if conn is not None and pid and not conn.closed:
            code = RC.QUOTA_EXCEEDED if result in _REFUSED else 0
            if result is RouteResult.QUEUE_QUOTA_EXCEEDED and conn.channel.level < 5:
                # A subscriber's queue refused it and a 3.1.1 PUBACK cannot say so: close
                # unacknowledged (the client resends it), as for a publish over the rate.
                # (Counted by the queue service, which refused it.)
                why = "a subscriber's queue is at the tenant's max_queue_depth"
                self.carry_out(conn, conn.channel.disconnect(RC.QUOTA_EXCEEDED, why))
                return
            eo = conn.exactly_once
            if code and conn.channel.level == 5 and eo is not None and pid in eo.recorded:
                self._release_qos2(conn, pid, code)  # the error PUBREC ends the exchange
                return
            conn.channel.publish_routed(pid, code)
            self.writes.mark(conn)

    def _routing_gave_up(self, conn: Conn | None) -> None:
        if conn is not None and not conn.closed:
            actions = conn.channel.disconnect(RC.SERVER_BUSY, "persistent routing unavailable")
            self.carry_out(conn, actions)
