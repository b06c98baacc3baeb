"""A connection node: the composition root that wires the modules that own its behaviours.

Who owns what: docs/architecture.md's module map. The node builds each module with what it
needs, by keyword where it takes many (what the node itself is built from: node_parts.py).

The channel (services/connection/channel/) is sans-I/O: `carry_out` hands its actions on.
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.common.bus.ids import MessageIds
from services.common.bus.large import Fetcher, Holder
from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.limits import max_message_bytes
from services.common.tasks import TaskSet
from services.connection.admission import Admission, PerAddress
from services.connection.channel import (
    Action,
    Authenticate,
    AutoSubscribe,
    Channel,
    Close,
    DeliveryProgress,
    Reauthenticate,
    ReleaseQos2,
    Route,
    SubscribeRequest,
    Unsubscribed,
)
from services.connection.conn import Conn, Sink
from services.connection.ending import Endings
from services.connection.events import SubscriptionEvents
from services.connection.exactly_once import ExactlyOnceInbound, Qos2Journal
from services.connection.fanout import Fanout
from services.connection.flow import FlowControl
from services.connection.ingress import Ingress
from services.connection.interest import MeshInterest
from services.connection.lease import NodeLease
from services.connection.linger import Linger
from services.connection.mesh import MeshPublisher
from services.connection.node_parts import NodeLinks, NodeSettings
from services.connection.ordered import OrderedOps
from services.connection.peer_cert import PeerCert
from services.connection.publish_answers import PublishAnswers
from services.connection.registry import Registry
from services.connection.retained import RetainedReplay
from services.connection.routing import RoutingPipeline
from services.connection.session_link import SessionLink
from services.connection.settling import SettlingConnections
from services.connection.shared import SharedDispatch
from services.connection.stats import NodeStats
from services.connection.subscribing import Subscriber
from services.connection.subscriptions import NodeSubscriptions
from services.connection.sweeper import Sweeper
from services.connection.sys_events import SysEvents
from services.connection.wills import Wills
from services.connection.writes import WriteBatcher

log = logging.getLogger("starling.connection")
# Large messages (over one NATS message) a node holds for other nodes to fetch, in units of
# the largest message: a few may be under way at once.
HOLD_MESSAGES = 4

# How long an ended connection's QoS 2 records or delayed will (settling.py) may hold back
# its release and a takeover's kick reply (the session service waits 1 s for that reply).
SETTLE_S = 0.8


class Node:
    def __init__(self, *, settings: NodeSettings, links: NodeLinks) -> None:
        self.config = settings.config
        self.rule_feed = links.rule_feed
        self.node_id = self.config.node_id
        self.nc = links.nc  # connected with no_echo: our own mesh publishes never come back
        self.nc_shared = links.nc_shared or links.nc  # queue groups: NATS picks among ours too
        self._new_client_id = settings.new_client_id
        self._loop = asyncio.get_event_loop()
        self.tasks = TaskSet()
        self._workers = TaskSet()
        self.registry = Registry()
        self.per_address = PerAddress(settings.max_connections_per_ip)
        self.refusals = links.refusals
        self.quota = links.quota
        self.stats = NodeStats(self.registry.conns, links.refusals)
        self.writes = WriteBatcher(self._loop)
        self.subs: NodeSubscriptions[Conn] = NodeSubscriptions()
        self.ops = OrderedOps()
        self.ids = MessageIds(self.node_id, time.time_ns())
        # Messages larger than one NATS message go by reference, held here for fetching.
        self.holder = Holder(self.node_id, HOLD_MESSAGES * max_message_bytes())
        self.mesh = MeshPublisher(self.nc, self.holder)
        # Which tenants other nodes listen to (0: unknown, publish everything on NATS).
        self.interest = MeshInterest(self.nc_shared, self.node_id, settings.mesh_interest_window_s)
        self.qos2_journal = Qos2Journal(links.session)
        self.answers = PublishAnswers(
            tasks=self.tasks, writes=self.writes, carry_out=self.carry_out
        )
        router = links.router
        self.routing: RoutingPipeline[Conn] | None = (
            RoutingPipeline(
                links.publish_router or router,
                self.answers.routed,
                self.answers.gave_up,
                on_acked=self.stats.acked,
            )
            if router
            else None
        )
        self._build_message_path(links, settings.tracing)
        self._build_session_path(links, settings)
        self._build_endings()
        self.linger = Linger(settings.linger_s, settings.linger_max_sockets)  # socket closes
        self.ack_wait_s = settings.ack_wait_s  # a drain's or shutdown's wait for owed acks

    def _build_message_path(self, links: NodeLinks, tracing: bool) -> None:
        """Fan-out, shared dispatch, subscribing, flow control and ingress: the modules a
        message passes through."""
        node_id, routing, router, feed = self.node_id, self.routing, links.router, links.rule_feed
        self.slots = links.slots(self.subs.counts) if links.slots is not None else None
        fanout = Fanout(node_id, self.subs, self.writes, tracing, Fetcher(self.nc))
        self.shared = SharedDispatch(
            self.nc_shared, self.writes, self.tasks, self.holder, Fetcher(self.nc_shared)
        )
        self.subscriber = Subscriber(
            node_id=node_id,
            subs=self.subs,
            nc=self.nc,
            nc_shared=self.nc_shared,
            ops=self.ops,
            fanout=fanout,
            shared=self.shared,
            retained=RetainedReplay(router, self.writes),
            writes=self.writes,
            router=router,
            interest=self.interest,
            # Subscription events when rules may read them (issue 17).
            events=SubscriptionEvents(self.nc, node_id, feed.emits) if feed else None,
            slots=self.slots,
            on_refused=self.refusals.count,
            queue=links.queue,  # clean sessions' reads of durable shared groups
        )
        self.flow = FlowControl(
            self._loop,
            lambda: self.mesh.queued,
            self.subscriber.inbound_backlog_bytes,
            lambda: len(routing) if routing is not None else 0,
        )
        self.ingress = Ingress(
            node_id=node_id,
            subs=self.subs,
            mesh=self.mesh,
            fanout=fanout,
            flow=self.flow,
            stats=self.stats,
            routing=routing,
            ids=self.ids,
            tracing=tracing,
            interest=self.interest,
            rules=self.rule_feed,
        )

    def _build_session_path(self, links: NodeLinks, settings: NodeSettings) -> None:
        """Wills, $SYS events, the session link, the lease and the sweeper: the modules a
        connection's life passes through."""
        node_id, feed = self.node_id, links.rule_feed
        self.wills = Wills(
            node_id=node_id,
            publish=self.ingress.publish,
            router=links.router,
            tasks=self.tasks,
            ids=self.ids,
            handoff_max_bytes=settings.will_store_max_bytes,
        )
        self.sys_events = SysEvents(
            node_id,
            self.ingress.reaches,
            lambda msgs: self.ingress.publish(msgs, None, counted=False),
        )
        self.settling = SettlingConnections(SETTLE_S)
        self.sessions = SessionLink(
            node_id=node_id,
            session=links.session,
            queue=links.queue,
            nc=self.nc_shared,
            registry=self.registry,
            subscriber=self.subscriber,
            wills=self.wills,
            sys_events=self.sys_events,
            ops=self.ops,
            writes=self.writes,
            tasks=self.tasks,
            carry_out=self.carry_out,
            tracing=settings.tracing,
            settle_first=self.settling.settled,
            auto_subscriptions=feed.auto_subscriptions if feed else None,  # issue 17
        )
        self.lease = NodeLease(self, self.nc, settings.self_fence_s, links.on_lease_change)
        self.sweeper = Sweeper(
            node_id=node_id,
            registry=self.registry,
            nc=self.nc,
            carry_out=self.carry_out,
            mark_dirty=self.mark_dirty,
            queue=links.queue,
            lease=self.lease,
        )

    def _build_endings(self) -> None:
        """Admission of a CONNECT, and how a connection ends."""
        self.admission = Admission(
            conns=self.registry.conns,
            per_address=self.per_address,
            lease=self.lease,
            refusals=self.refusals,
            carry_out=self.carry_out,
            authenticate=self.sessions.authenticate,
        )
        self.endings = Endings(
            registry=self.registry,
            sweeper=self.sweeper,
            per_address=self.per_address,
            writes=self.writes,
            flow=self.flow,
            subscriber=self.subscriber,
            shared=self.shared,
            ops=self.ops,
            tasks=self.tasks,
            stats=self.stats,
            wills=self.wills,
            sys_events=self.sys_events,
            sessions=self.sessions,
            settling=self.settling,
            settle_s=SETTLE_S,
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
        await flushed(self.nc, 5)
        self._workers.spawn(self.mesh.run(), name="node-mesh-publisher")
        self._workers.spawn(self.ops.run(), name="node-ordered-ops")
        self._workers.spawn(self.sweeper.run(), name="node-sweeper")
        self._workers.spawn(self.qos2_journal.run(), name="node-qos2-journal")
        if self.routing is not None:
            self._workers.spawn(self.routing.run(), name="node-routing")

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
        """Before closing `conns`: wait (at most `timeout_s`) for the acks they are owed
        (ending.py), then stop the node's background work."""
        await self.endings.answer_owed(conns, timeout_s)
        await self._workers.cancel()
        await self.interest.stop()
        if self.quota is not None:
            await self.quota.stop()
        try:
            await flushed(self.nc, 1)
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
        conn: Conn  # the channel calls `on_resume` only once connected, long after this

        def resume() -> None:
            conn.resume_delivery()

        cfg, new_id, count = self.config, self._new_client_id, self.refusals.count
        channel = Channel(cfg, peer, now, new_id, on_limit=count, gates=gates, on_resume=resume)
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
                self.answers.release(conn, self._exactly_once(conn), action.packet_id)
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
                self.admission.admit(conn, action)
            elif isinstance(action, Reauthenticate):
                self.sessions.reauthenticate(conn, action)
            elif isinstance(action, Close):
                self.endings.close(conn)
        if conn.channel.out and not conn.closed:
            self.writes.mark(conn)

    def mark_dirty(self, conn: Conn) -> None:
        if not conn.closed:
            self.writes.mark(conn)

    def sweep_at(self, conn: Conn, at: float) -> None:
        if not conn.closed:
            self.sweeper.schedule(conn, at)

    def cleanup(self, conn: Conn) -> asyncio.Task[None] | None:
        """Exactly once per connection (ending.py); the detach of its queue reader, if any."""
        return self.endings.cleanup(conn)

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
                tenant=ch.tenant,
                client_id=ch.client_id,
                incarnation=ch.incarnation,
                journal=self.qos2_journal,
                new_id=self.ids.next,
                publish=lambda msgs: self.ingress.publish(msgs, conn),
                store_only=lambda msg: self._store_only(conn, msg),
                failed=failed,
                tasks=self.tasks,
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
