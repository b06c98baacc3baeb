"""A connection's link to its session: authenticate, resume, take over, release.

CONNECT: gather the facts (`connect_attempt`), ask the session service (which authenticates,
registers the connection under a new epoch and opens or resumes the session), then carry out
its outcome: the channel answers CONNACK; an accepted connection joins the registry, settles a
pending will, and a persistent session gets its stored subscriptions back and its queue
delivered. The tenant's auto-subscriptions (docs/rules.md) are rendered for the client and
handed to the channel with the outcome; when it takes any, its CONNACK waits until the node
has them in place on the mesh (`AutoSubscribe`, carried out by the node's `Subscriber`), and
the queue delivery starts after that. A kick for this client that arrived while we asked
means a newer connection won: this one is closed with 0x8E right after its CONNACK.

Takeover: the session service publishes a kick on `ctl.node.<node_id>` naming the epoch it
supersedes; every connection of that client with an epoch at or below it is closed.

Registry lost (Redis lost its data): the session service asks every node to re-assert what it
holds; this node re-claims each accepted connection (the later epoch of a client id wins, the
loser is kicked as in a takeover).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine

from nats.aio.client import Client
from nats.aio.msg import Msg
from opentelemetry import trace

from services.common.connect import (
    ConnectAttempt,
    ConnectOutcome,
    ReauthAttempt,
    requested_session_expiry,
)
from services.common.dependencies import wait_for
from services.common.mqtt.reason import ReasonCode as RC
from services.common.tasks import TaskSet
from services.common.topics.autosub import AutoSubscription, render_all
from services.connection.channel import (
    Action,
    Authenticate,
    Channel,
    Reauthenticate,
    State,
    SubscribeRequest,
)
from services.connection.conn import Conn
from services.connection.ordered import OrderedOps
from services.connection.peer_cert import PeerCert
from services.connection.persistence import DeliveryDeps, PersistentDelivery
from services.connection.registry import Registry
from services.connection.subscribing import Subscriber
from services.connection.sys_events import SysEvents
from services.connection.wills import Wills, will_delay_s
from services.connection.writes import WriteBatcher
from services.queue.client import QueueClient, queue_id
from services.session.client import SessionClient
from starling.connection.v1 import connection_pb2
from starling.session.v1 import session_pb2

log = logging.getLogger("starling.connection.session")

# A release the session service did not confirm is sent again for this long
# (see `SessionLink.release`).
RELEASE_RETRY_FOR_S = 30.0
tracer = trace.get_tracer("starling.connection")


def connect_attempt(
    node_id: str,
    peer: str,
    action: Authenticate,
    cert: PeerCert | None = None,
    will: bytes = b"",
) -> ConnectAttempt:
    """`will`: the CONNECT's will as handed to the session service (Wills.handoff)."""
    p = action.connect
    return ConnectAttempt(
        client_id=action.client_id,
        username=p.username or "",
        password=p.password,
        node_id=node_id,
        peer_address=peer,
        protocol_level=p.protocol_level,
        clean_start=p.clean_start,
        session_expiry_s=requested_session_expiry(
            p.protocol_level, p.clean_start, p.properties.session_expiry_interval
        ),
        cert_common_name=cert.common_name if cert else "",
        cert_subject_alt_names=cert.alt_names if cert else (),
        auth_method=p.properties.authentication_method or "",
        auth_data=action.auth_data or b"",
        auth_state=action.auth_state,
        will=will,
        will_delay_s=(p.will.properties.will_delay_interval or 0) if will and p.will else 0,
    )


async def _settled(tenant: str, client_id: str) -> None:
    """The default `SessionLink.settle_first`: nothing to wait for."""


class SessionLink:
    def __init__(
        self,
        *,
        node_id: str,
        session: SessionClient,
        queue: QueueClient | None,
        nc: Client,
        registry: Registry,
        subscriber: Subscriber,
        wills: Wills,
        sys_events: SysEvents,
        ops: OrderedOps,
        writes: WriteBatcher,
        tasks: TaskSet,
        carry_out: Callable[[Conn, list[Action]], None],
        tracing: bool = False,
        settle_first: Callable[[str, str], Awaitable[None]] = _settled,
        auto_subscriptions: Callable[[str], tuple[AutoSubscription, ...]] | None = None,
    ) -> None:
        """`settle_first(tenant, client_id)`: awaited before a takeover's kick is answered
        (the node waits for the QoS 2 records of the client's ended connection).
        `auto_subscriptions(tenant)`: a tenant's auto-subscription templates
        (services/rules/client.py), if any."""
        self._node_id = node_id
        self._session = session
        self._nc = nc  # queue notices and kick replies
        self._delivery_deps = (
            DeliveryDeps(queue=queue, nc=nc, now=time.time) if queue is not None else None
        )
        self._registry = registry
        self._subscriber = subscriber
        self._wills = wills
        self._sys_events = sys_events
        self._ops = ops
        self._writes = writes
        self._tasks = tasks
        self._carry_out = carry_out
        self._tracing = tracing
        self.settle_first = settle_first
        self.auto_subscriptions = auto_subscriptions

    def authenticate(self, conn: Conn, action: Authenticate) -> None:
        self._tasks.spawn(self._authenticate(conn, action), name="authenticate")

    async def _authenticate(self, conn: Conn, action: Authenticate) -> None:
        will = self._wills.handoff(action.connect.will, action.client_id)
        attempt = connect_attempt(self._node_id, conn.channel.peer, action, conn.cert, will)
        outcome = await self._ask(attempt)
        if conn.closed:
            if outcome.ok:  # the client left while we asked: release the registry entry
                await self._release_accepted(outcome, action.client_id)
            return
        if outcome.ok and self._registry.superseded(
            (outcome.tenant, action.client_id), outcome.epoch
        ):
            outcome = dataclasses.replace(outcome, taken_over=True)
        ch = conn.channel
        auto = self._auto_subscriptions(ch, outcome)
        actions = ch.authenticated(outcome, time.time(), auto)
        if outcome.ok and ch.state is State.CLOSED:
            # Accepted by the session service, then closed by the channel (the CONNACK does
            # not fit the client's Maximum Packet Size): the entry goes as for a client that
            # left, and its kept will with it.
            self._carry_out(conn, actions)
            await self._release_accepted(outcome, action.client_id)
            return
        delivery: PersistentDelivery | None = None
        if ch.state in (State.ACCEPTED, State.CONNECTED):
            self._registry.accepted(conn)
            if outcome.taken_over:
                actions += ch.disconnect(RC.SESSION_TAKEN_OVER, "a newer connection took it")
            else:
                if outcome.settle_will:  # a delayed will of the last connection may wait
                    self._tasks.spawn(
                        self._wills.settle(ch.tenant, ch.client_id, outcome.session_present)
                    )
                self._sys_events.connected(ch, outcome.session_present)
                if ch.persistent:
                    delivery = self._resume(conn, outcome)
        if actions:  # an `AutoSubscribe` among them: the CONNACK waits for it
            self._carry_out(conn, actions)
        if delivery is not None and not conn.closed:
            # After the auto-subscriptions, whose operation releases the CONNACK: nothing
            # from the queue may reach the client before it.
            self._ops.put(delivery.start)
        if ch.out and not conn.closed:
            self._writes.mark(conn)

    def reauthenticate(self, conn: Conn, action: Reauthenticate) -> None:
        self._tasks.spawn(self._reauthenticate(conn, action), name="reauthenticate")

    async def _reauthenticate(self, conn: Conn, action: Reauthenticate) -> None:
        ch = conn.channel
        attempt = ReauthAttempt(
            tenant=ch.tenant,
            identity=action.identity,
            client_id=ch.client_id,
            peer_address=ch.peer,
            auth_method=action.method,
            auth_data=action.data,
            auth_state=action.state,
        )
        try:
            outcome = await self._session.reauthenticate(attempt)
        except Exception as exc:
            log.warning("session_unavailable", extra={"error": str(exc)})
            outcome = ConnectOutcome(reason_code=RC.SERVER_UNAVAILABLE)
        if conn.closed:
            return
        actions = ch.reauthenticated(outcome, time.time())
        if actions:
            self._carry_out(conn, actions)
        if ch.out and not conn.closed:
            self._writes.mark(conn)

    async def _ask(self, attempt: ConnectAttempt) -> ConnectOutcome:
        try:
            if not self._tracing:  # a no-op span still costs ~10% of a CONNECT's work here
                return await self._session.connect(attempt)
            with tracer.start_as_current_span(
                "mqtt.connect",
                attributes={"starling.node": self._node_id, "mqtt.client_id": attempt.client_id},
            ):
                return await self._session.connect(attempt)
        except Exception as exc:
            log.warning("session_unavailable", extra={"error": str(exc)})
            return ConnectOutcome(reason_code=RC.SERVER_UNAVAILABLE)

    def _resume(self, conn: Conn, outcome: ConnectOutcome) -> PersistentDelivery | None:
        """A persistent session: restore its subscriptions here (before the
        auto-subscriptions, which skip what it holds); its queue delivery, to start."""
        ch = conn.channel
        if outcome.subscriptions:
            self._subscriber.subscribe(
                conn, SubscribeRequest(0, outcome.subscriptions, ()), answer=False
            )
        if self._delivery_deps is None:
            return None
        persistent = conn.persistent = PersistentDelivery(
            channel=ch,
            deps=self._delivery_deps,
            tenant=ch.tenant,
            queue_id=queue_id(ch.client_id, ch.incarnation),
            wrote=lambda: self._writes.mark(conn),
            wake=lambda at: conn.shell.sweep_at(conn, at),
        )
        return persistent

    def _auto_subscriptions(self, ch: Channel, outcome: ConnectOutcome) -> list[tuple[str, int]]:
        """The tenant's auto-subscriptions rendered for this client (filter, QoS); none for a
        refused or taken over connection (the channel skips those a resumed session holds)."""
        if not outcome.ok or outcome.taken_over or self.auto_subscriptions is None:
            return []
        templates = self.auto_subscriptions(outcome.tenant)
        if not templates:
            return []
        user = outcome.identity.partition("/")[2]
        return render_all(templates, ch.client_id, user, ch.config.topic_limits)

    async def _release_accepted(self, outcome: ConnectOutcome, client_id: str) -> None:
        """Release a CONNECT the session service accepted but no connection carries on."""
        await self.release(
            outcome.tenant,
            client_id,
            outcome.epoch,
            outcome.incarnation,
            None,
            outcome.qos2_fence,
        )

    def connection_ended(self, conn: Conn) -> None:
        self._tasks.spawn(self._release_connection(conn))

    def _release_connection(self, conn: Conn) -> Coroutine[None, None, None]:
        """The release of the registry entry of a connection that ended, as its DISCONNECT
        left it (read now, when it ended)."""
        ch = conn.channel
        return self.release(
            ch.tenant,
            ch.client_id,
            ch.epoch,
            ch.incarnation,
            ch.disconnect_expiry_s,
            ch.qos2_fence,
        )

    async def release(
        self,
        tenant: str,
        client_id: str,
        epoch: int,
        incarnation: int,
        expiry_s: int | None,
        fence: int = 0,
    ) -> None:
        """Tell the session service the connection ended, tried again with backoff for
        RELEASE_RETRY_FOR_S: an entry never released would stay until this node dies, and
        then be taken for a connection that died with it (session parked at that time, its
        will published). Idempotent: a release that was done and is sent again finds the
        entry gone, or another connection's."""

        async def disconnect() -> bool:
            return await self._session.disconnect(
                tenant, client_id, epoch, self._node_id, incarnation, expiry_s, fence
            )

        try:
            await wait_for("session release", disconnect, RELEASE_RETRY_FOR_S, (Exception,))
        except Exception as exc:
            log.warning("session_release_failed", extra={"error": str(exc)})

    async def on_kick(self, msg: Msg) -> None:
        """Takeover or admin kick: close this client's connections up to the kick's epoch."""
        kick = connection_pb2.Kick.FromString(msg.data)
        key = (kick.tenant, kick.client_id)
        ended, expiry_s = self._registry.ended(key, kick.epoch)
        known = self._registry.knows(key, kick.epoch)
        for conn in self._registry.kick(key, kick.epoch, time.monotonic()):
            actions = conn.channel.disconnect(
                kick.reason_code or RC.ADMINISTRATIVE_ACTION, "kicked"
            )
            self._carry_out(conn, actions)
        if msg.reply:  # a CONNECT displaced it: say whether it had ended, and how
            await self.settle_first(kick.tenant, kick.client_id)
            reply = connection_pb2.KickReply(ended=ended, unknown=not known)
            if expiry_s is not None:
                reply.session_expiry_interval_s = expiry_s
            await self._nc.publish(msg.reply, reply.SerializeToString())

    async def on_registry_lost(self, msg: Msg) -> None:
        """The session registry was lost: re-assert every connection this node holds."""
        await self.reassert(msg.data.decode())

    async def reassert(self, generation: str) -> None:
        """Re-assert every connection this node holds (also after its lease lapsed, lease.py)."""
        held = self._registry.held()
        if not held:
            return
        try:
            reclaimed, superseded = await self._session.reclaim(
                self._node_id, [_held_connection(c, self._wills) for c in held]
            )
        except Exception as exc:
            log.warning("registry_reassert_failed", extra={"error": str(exc)})
            return
        log.warning(
            "registry_reasserted",
            extra={
                "reclaimed": reclaimed,
                "superseded": superseded,
                "generation": generation,
            },
        )
        for conn in held:
            if conn.closed:
                # It ended while being re-asserted: its release may have come first, found no
                # entry, and the re-claim installed one again; release that one.
                await self._release_connection(conn)


def _held_connection(conn: Conn, wills: Wills) -> session_pb2.HeldConnection:
    ch = conn.channel
    held = session_pb2.HeldConnection(
        tenant=ch.tenant,
        client_id=ch.client_id,
        epoch=ch.epoch,
        username=ch.username.partition("/")[2] if "/" in ch.username else ch.username,
        peer_address=ch.peer,
        protocol_level=ch.level,
    )
    # The entry lost its will with the registry: handed again, so that a death of this node
    # after the loss still has its clients' wills published.
    if ch.will is not None and ch.acl.can_publish(ch.will.topic):
        held.will = wills.handoff(ch.will, ch.client_id)
        held.will_delay_s = will_delay_s(ch) if held.will else 0
    return held
