"""Per-client MQTT state machine for 3.1, 3.1.1 and 5.0: bytes and ticks in, bytes and actions
out. It never awaits, never touches a socket and never reads the clock (time comes in as `now`,
assigned client ids from `new_client_id`); the node is its shell.

Theory of operation:
- `receive(data, now)` decodes packets and hands each to the module that owns its family
  (table `_DISPATCH`): handshake.py (CONNECT, packets held until CONNACK), inbound.py
  (PUBLISH from the client, PUBREL), outbound.py (deliveries, PUBACK/PUBREC/PUBCOMP),
  subscriptions.py (SUBSCRIBE, UNSUBSCRIBE), control.py (PINGREQ, DISCONNECT, keep alive).
- Replies accumulate in `out` (the shell writes `bytes(out)` and clears it). What needs I/O
  comes back as actions, in packet order: consecutive publishes collapse into one `Route`, any
  other action between them starts a new one. A `DeliveryProgress` (at most one per call)
  follows the other actions, but precedes a `Close`, which is always last.
- Every call that returns actions returns a fresh `list[Action]` the caller owns and may
  extend; an empty list costs one small allocation per call, next to the decoding it follows.
- CONNECT yields `Authenticate`; packets that arrive before `authenticated` are held and
  replayed by it, in order, so it returns actions too. When the tenant's auto-subscriptions
  give the client any (`authenticated(..., auto=...)`), it returns `AutoSubscribe` instead and
  the channel is ACCEPTED: the CONNACK and the held packets wait for `auto_subscribed`, so the
  client gets its CONNACK once they are in place, as a resumed session's subscriptions are.
  With enhanced authentication (MQTT 5 AUTH, enhanced_auth.py) `authenticated` may instead
  write AUTH 0x18; the client's AUTH answer yields the next `Authenticate`. A connected
  client's AUTH 0x19 yields `Reauthenticate`, answered by `reauthenticated`.
- SUBSCRIBE yields `SubscribeRequest`; the SUBACK waits for `subscribed`.
- A client that breaks a rule makes a family raise `MqttError` (its reason code says why);
  only this connection closes: DISCONNECT with the code on MQTT 5 (CONNACK with it while the
  session does not exist yet), a plain close on 3.1/3.1.1.
- Until the CONNECT is accepted the decoder allows `max_connect_packet_size_bytes` only: a
  peer nobody knows yet cannot make us read a large packet. Every configured limit a client
  exceeds is reported through `on_limit(setting name, tenant)` (the node counts them; the
  tenant is "" before authentication).
- `state` only moves forward: AWAIT_CONNECT -> AUTHENTICATING -> (ACCEPTED ->) CONNECTED ->
  CLOSED, and any state may go straight to CLOSED. Nothing is written or returned after CLOSED.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any, cast

from services.common.acl import AclChecker
from services.common.connect import ConnectOutcome
from services.common.message import Message
from services.common.mqtt.body_decoder import DecodeLimits
from services.common.mqtt.decoder import Decoder
from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import (
    MqttError,
    PacketTooLargeError,
    ProtocolViolationError,
    QuotaExceededError,
    UnsupportedProtocolVersionError,
)
from services.common.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import validate_topic_name
from services.connection.channel.actions import (
    Action,
    Authenticate,
    AutoSubscribe,
    Close,
    DeliveryProgress,
    Reauthenticate,
    Route,
    SubscribeRequest,
)
from services.connection.channel.config import ChannelConfig
from services.connection.channel.control import (
    PINGRESP,
    KeepAlive,
    enforced_keepalive,
    read_disconnect,
)
from services.connection.channel.enhanced_auth import AuthExchange
from services.connection.channel.handshake import Handshake
from services.connection.channel.inbound import InboundPublishes, PublishGate
from services.connection.channel.outbound import (
    AWAIT_PUBACK,
    AWAIT_PUBCOMP,
    AWAIT_PUBREC,
    Outbound,
)
from services.connection.channel.problems import Problems, describe
from services.connection.channel.subscriptions import ClientSubscriptions

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.budget import DeliveryGate

_PROGRESS = DeliveryProgress()  # it carries nothing: one instance serves every channel
_V3_UNACCEPTABLE_PROTOCOL = b"\x20\x02\x00\x01"  # CONNACK with 3.1.1 return code 1
# 3.1/3.1.1 have no return code for these: a CONNECT that breaks them is closed without a
# CONNACK [MQTT-3.1.4-1] (return code 3, "server unavailable", would have the client retry for
# ever). TOPIC_NAME_INVALID: a will topic with a wildcard, or over the topic limits.
_V3_CLOSE_ONLY = frozenset({RC.MALFORMED_PACKET, RC.PROTOCOL_ERROR, RC.TOPIC_NAME_INVALID})
_REDIRECTS = frozenset({RC.USE_ANOTHER_SERVER, RC.SERVER_MOVED})
# Decoder limit names -> the settings that set them (what `on_limit` reports).
_DECODER_LIMITS = {"max_topic_filters": "max_filters_per_subscribe"}


def _nothing() -> None:
    pass


def _uncounted(limit: str, tenant: str) -> None:
    """The default `on_limit`: nobody counts."""


class _Deaf(Decoder):
    """The decoder of a channel that stopped reading (`Channel.stop_reading`): it drops
    every byte, so the shell's receive path stays as it is."""

    __slots__ = ()

    def feed(self, data: bytes) -> list[Packet]:
        return []


class State(IntEnum):
    AWAIT_CONNECT = 1
    AUTHENTICATING = 2
    ACCEPTED = 3  # the session exists; the CONNACK waits for the auto-subscriptions
    CONNECTED = 4
    CLOSED = 5


# Packets that come meanwhile are held for after the CONNACK.
_BEFORE_CONNACK = frozenset({State.AUTHENTICATING, State.ACCEPTED})


# The stage of an outbound exchange each client ack moves on (outbound.py).
_ACK_STAGE: dict[type, int] = {PubAck: AWAIT_PUBACK, PubRec: AWAIT_PUBREC, PubComp: AWAIT_PUBCOMP}


class Channel:
    """One client connection's MQTT logic. Feed it with `receive`, `authenticated`,
    `subscribed`, `publish_routed`, `deliver` and `tick`; write `out`; carry out the actions."""

    __slots__ = (
        "_auth",
        "_control_at",
        "_control_tokens",
        "_decoder",
        "_gates",
        "_handshake",
        "_inbound",
        "_keepalive",
        "_on_limit",
        "_problems",
        "_subscriptions",
        "acl",
        "bytes_received",
        "bytes_sent",
        "client_id",
        "config",
        "disconnect_expiry_s",
        "epoch",
        "incarnation",
        "level",
        "normal_disconnect",
        "on_resume",
        "out",
        "outbound",
        "packets_received",
        "peer",
        "persistent",
        "qos2_fence",
        "session_expiry_s",
        "state",
        "tenant",
        "username",
        "will",
    )

    def __init__(
        self,
        config: ChannelConfig,
        peer: str,
        now: float,
        new_client_id: Callable[[], str],
        on_limit: Callable[[str, str], None] = _uncounted,
        gates: Callable[[str, str], PublishGate | None] | None = None,
    ) -> None:
        """`gates(tenant, user)`: the publish budgets of an accepted connection (None: no
        rate limits)."""
        self.config = config
        self._gates = gates
        self._on_limit = on_limit
        self.peer = peer
        self.state = State.AWAIT_CONNECT
        self.level = 4  # until CONNECT says otherwise
        self.out = bytearray()
        # Every byte and packet the client sent, and every byte written to it (the shell
        # adds those as it writes): `$SYS` figures, counted per read and per write, not per
        # packet, so they cost nothing on the hot path.
        self.bytes_received = 0
        self.packets_received = 0
        self.bytes_sent = 0
        self.client_id = ""
        self.username = ""
        self.tenant = ""
        self.epoch = 0
        self.qos2_fence = 0  # stamped on this connection's QoS 2 records (exactly_once.py)
        # The control-packet budget (ChannelConfig.control_packets_per_s): tokens and when.
        self._control_tokens = float(config.control_packets_burst)
        self._control_at = now
        self.incarnation = 0
        # The session has a stored record and queue: it outlives the connection, or it was
        # resumed (then its queue is delivered even if the new expiry is 0 [MQTT-3.1.2-4]).
        self.persistent = False
        self.session_expiry_s = 0
        self.disconnect_expiry_s: int | None = None  # set by the client's DISCONNECT
        self.will: Will | None = None
        self.normal_disconnect = False
        self.acl = AclChecker([], True)
        # Called when held deliveries may move again (the shell sets it; see Outbound.gate).
        self.on_resume: Callable[[], None] = _nothing
        self.outbound = Outbound(
            self.out,
            4,
            config.v3_inflight,
            config.max_packet_size_bytes,
            0,
            config.max_queued_messages,
            config.max_queued_bytes,
        )
        self._decoder = Decoder(
            4,
            min(config.max_connect_packet_size_bytes, config.max_packet_size_bytes),
            DecodeLimits(config.max_user_properties, config.max_filters_per_subscribe),
        )
        self._handshake = Handshake(config, new_client_id)
        self._problems = problems = Problems(config.reason_strings)
        self._inbound = InboundPublishes(config, self.out, self.acl, problems)
        self._subscriptions = ClientSubscriptions(config, self.out, self.acl, problems, self._limit)
        self._keepalive = KeepAlive(now)
        self._auth = AuthExchange()

    @property
    def identity(self) -> str:
        """`tenant/name` the connection authenticated as ("" before, or anonymous)."""
        return self._auth.identity

    @property
    def subscriptions(self) -> dict[str, int | None]:
        """Filter -> Subscription Identifier of everything the client is subscribed to."""
        return self._subscriptions.filters

    # ---- the shell's calls ---------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list[Action]:
        """Bytes from the transport: handle every packet they complete."""
        actions: list[Action] = []
        if self.state is State.CLOSED:
            return actions
        self._keepalive.last_rx = now
        self.bytes_received += len(data)
        try:
            packets = self._decoder.feed(data)
        except MqttError as exc:
            # The packets before the broken one still count, in order; then close.
            self.packets_received += len(exc.packets)
            self._handle_all(cast("list[Packet]", exc.packets), now, actions, exc)
            return actions
        if packets:
            self.packets_received += len(packets)
            self._handle_all(packets, now, actions)
        return actions

    def authenticated(
        self, outcome: ConnectOutcome, now: float, auto: Sequence[tuple[str, int]] = ()
    ) -> list[Action]:
        """The session service's answer to `Authenticate`: CONNACK, then the held packets.
        `auto`: the tenant's auto-subscriptions (filter, QoS) rendered for this client by the
        node; those it takes (not held yet, valid, allowed by its ACL, within its limit) are
        recorded as its own and returned in `AutoSubscribe`, and the CONNACK waits for
        `auto_subscribed`."""
        actions: list[Action] = []
        if self.state is not State.AUTHENTICATING:
            return actions
        if outcome.auth_continue and self._auth.method is not None:
            self.out += self._auth.challenge(outcome.auth_data, outcome.auth_state, now)
            return actions
        if not outcome.ok:
            self.will = None  # a refused connection leaves no will
            actions.append(self._refuse(outcome.reason_code, outcome.reason_string))
            return actions
        connack = self._accept(outcome, now)
        if len(connack) > self.outbound.max_packet_size:
            # [MQTT-3.1.2-24] Not even the CONNACK fits the client's Maximum Packet Size: it
            # is not sent, and the connection closes (without a will: nothing went wrong).
            self.will = None
            actions.append(
                self._close(RC.PACKET_TOO_LARGE, "the CONNACK exceeds the client's maximum")
            )
            return actions
        request = self._subscriptions.auto(auto) if auto else None
        if request is not None:
            self.state = State.ACCEPTED
            self._handshake.hold_connack(connack, now)
            actions.append(AutoSubscribe(request))
            return actions
        self.out += connack
        self._handle_all(self._handshake.release_held(), now, actions)
        return actions

    def auto_subscribed(self, ok: bool, now: float) -> list[Action]:
        """The node carried out `AutoSubscribe`: the CONNACK goes, then the held packets. Not
        `ok` (the node could not put them in place) refuses the CONNECT with 0x88 Server
        unavailable: the client retries, rather than run without subscriptions its tenant
        gives every client."""
        actions: list[Action] = []
        if self.state is not State.ACCEPTED:
            return actions
        if not ok:
            self.will = None  # a refused connection leaves no will
            actions.append(self._refuse(RC.SERVER_UNAVAILABLE))
            return actions
        self._release_connack()
        self._handle_all(self._handshake.release_held(), now, actions)
        return actions

    def reauthenticated(self, outcome: ConnectOutcome, now: float) -> list[Action]:
        """The session service's answer to `Reauthenticate`: AUTH 0x18 to go on, AUTH 0x00
        when done, or DISCONNECT with the refusal's reason code."""
        if self.state is not State.CONNECTED:
            return []
        if outcome.auth_continue:
            self.out += self._auth.challenge(outcome.auth_data, outcome.auth_state, now)
            return []
        if not outcome.ok:
            return [self._shut(outcome.reason_code, "re-authentication failed")]
        self.out += self._auth.succeeded(outcome.auth_data)
        return []

    def subscribed(self, request: SubscribeRequest) -> None:
        """The node carried out `request`: record the subscriptions and write the SUBACK."""
        if self.state is State.CONNECTED:
            self._subscriptions.subscribed(request)

    def publish_routed(self, packet_id: int, reason_code: int = 0) -> None:
        """The node finished routing a deferred publish: its PUBACK/PUBREC may go (with
        `reason_code` on MQTT 5; 3.1/3.1.1 get a plain ack)."""
        if self.state is State.CONNECTED:
            self._inbound.routed(packet_id, reason_code)

    def qos2_released(self, packet_id: int) -> None:
        """The node carried out `ReleaseQos2`: the PUBCOMP may go."""
        if self.state is State.CONNECTED:
            self._inbound.released(packet_id)

    def deliver(
        self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...], now: float
    ) -> None:
        """A message from the mesh for this client, at its effective QoS."""
        if self.state is State.CONNECTED:
            self.outbound.deliver(msg, qos, retain, sub_ids, now)

    def disconnect(self, code: int, reason: str, server_reference: str = "") -> list[Action]:
        """Server-initiated close: DISCONNECT(code) on MQTT 5, then close. With
        `server_reference` (0x9C Use another server, 0x9D Server moved) the DISCONNECT names
        where to go [MQTT-3.14.2.2.5]; a client still authenticating gets it in its CONNACK."""
        if self.state is State.CLOSED:
            return []
        if self.state in _BEFORE_CONNACK and code in _REDIRECTS:
            # Refused before it began: CONNACK naming the server (3.1.1: return code 3).
            self._handshake.server_reference = server_reference
            self.will = None  # a refused connection leaves no will
            return [self._refuse(code)]
        return [self._shut(code, reason, server_reference)]

    @property
    def owes_acks(self) -> bool:
        """The node has yet to answer some of the client's packets: a PUBACK/PUBREC waits
        for its publish to be stored, a PUBCOMP for its release to be written."""
        return self._inbound.owes_acks

    def stop_reading(self) -> None:
        """The node is about to close this connection: drop the client's packets from now on,
        so that no exchange begins while those under way finish and their acks are written
        (what the client sent and got no answer for, it sends again on its next
        connection [MQTT-4.4.0-1])."""
        self._decoder = _Deaf(self._decoder.protocol_level)

    def tick(self, now: float) -> list[Action]:
        """Close a client silent for too long, one that never sent CONNECT, or one that has
        not read from its socket for `slow_consumer_timeout_s`."""
        state = self.state
        if state is State.CONNECTED and self._keepalive.silent_too_long(now):
            return [self._shut(RC.KEEP_ALIVE_TIMEOUT, "keep alive timeout")]
        if now > self._congestion_deadline():
            # It has not read what we sent for that long: stop holding buffers for it (a
            # persistent session's messages wait in its queue for the next connection).
            return [self._shut(RC.QUOTA_EXCEEDED, "slow consumer: not reading")]
        timeout_s = self.config.connect_timeout_s
        if state is State.AWAIT_CONNECT and self._keepalive.connect_overdue(now, timeout_s):
            self._limit("connect_timeout_s")
            return [self._close(RC.MAXIMUM_CONNECT_TIME, "no CONNECT in time")]
        if state is State.AUTHENTICATING and self._auth.overdue(now, timeout_s):
            return [self._close(RC.MAXIMUM_CONNECT_TIME, "no AUTH in time")]
        if state is State.ACCEPTED and self._handshake.connack_overdue(
            now, self.config.auto_subscribe_timeout_s
        ):
            # The mesh did not confirm them in time: the client retries (see `auto_subscribed`).
            self._limit("auto_subscribe_timeout_s")
            self.will = None
            return [self._refuse(RC.SERVER_UNAVAILABLE)]
        return []

    def next_check(self, now: float) -> float:
        """When `tick` may next have something to do, if nothing else happens to this
        channel: `now` during the handshake (every tick), else the end of its keep-alive
        (each packet moves it later, so a look then may find it not yet due) or of its
        slow-consumer timeout, whichever comes first (inf: neither). A congestion that
        starts later asks the sweeper for a look itself (Conn.writable)."""
        if self.state is not State.CONNECTED:
            return now
        return min(self._keepalive.deadline(), self._congestion_deadline())

    def _congestion_deadline(self) -> float:
        """A client that has not read what we sent for `slow_consumer_timeout_s` is closed
        (inf: not congested)."""
        since = self.outbound.congested_since
        return since + self.config.slow_consumer_timeout_s if since else math.inf

    def _limit(self, name: str) -> None:
        self._on_limit(name, self.tenant)

    def connection_lost(self) -> None:
        """The transport is gone (either side closed it)."""
        self.state = State.CLOSED

    # ---- dispatch ------------------------------------------------------------------------

    def _handle_all(
        self,
        packets: Iterable[Packet],
        now: float,
        actions: list[Action],
        broken: MqttError | None = None,
    ) -> None:
        """Handle `packets` in order, appending to `actions` (see the module doc for the
        order); then close for `broken`, the decoding error that followed them, if any."""
        messages: list[Message] | None = None  # of the Route being filled
        progress = False
        closing: Action | None = None
        inbound = self._inbound
        gate = inbound.gate
        if gate is not None:  # the read's publishes are charged to the budgets together
            gate.begin()
        try:
            for p in packets:
                if type(p) is Publish and self.state is State.CONNECTED:  # the hot path
                    msg = inbound.receive(p, now)
                    if msg is not None:
                        if messages is None:
                            messages = []
                            actions.append(Route(messages))
                        messages.append(msg)
                    continue
                action = self._handle(p, now)
                if action is None:
                    continue
                if action is _PROGRESS:
                    progress = True
                elif self.state is State.CLOSED:
                    closing = action
                    break
                else:
                    messages = None  # a publish after this action starts a new Route
                    actions.append(action)
        except MqttError as exc:
            broken = exc
        finally:
            if gate is not None:
                gate.end()
        if progress:  # before a Close: the acks came before what closed the connection
            actions.append(_PROGRESS)
        if closing is not None:
            actions.append(closing)
        elif broken is not None and self.state is not State.CLOSED:
            actions.append(self._fail(broken))

    def _handle(self, p: Packet, now: float) -> Action | None:
        state = self.state
        if state is State.CONNECTED:
            handler = _DISPATCH.get(type(p))
            if handler is None:
                raise ProtocolViolationError(f"unexpected {type(p).__name__} from client")
            if not self._control_budget(p, now):
                self._on_limit("control_packets_per_s", self.tenant)
                return self._shut(RC.MESSAGE_RATE_TOO_HIGH, "too many control packets")
            return handler(self, p, now)
        if state is State.AWAIT_CONNECT:
            if type(p) is not Connect:  # [MQTT-3.1.0-1]
                return self._close(RC.PROTOCOL_ERROR, "first packet must be CONNECT")
            return self._on_connect(p)
        if state is State.AUTHENTICATING and type(p) is Auth and self.level == 5:
            return self._on_connect_auth(p)
        if state in _BEFORE_CONNACK and not self._handshake.hold(p):
            raise ProtocolViolationError("too many packets before CONNACK")
        return None

    # ---- opening and closing -------------------------------------------------------------

    def _on_connect(self, p: Connect) -> Action:
        self.level = level = p.protocol_level
        self.outbound.level = level
        self._problems.begin(p)
        client_id, refusal = self._handshake.begin(p)
        if refusal:
            if refusal == RC.TOPIC_NAME_INVALID and p.will is not None:
                self._count_will_topic_limit(p.will.topic)
            return self._refuse(refusal)
        self.client_id = client_id
        self.username = p.username or ""
        self.will = p.will
        cfg = self.config
        keepalive_s = enforced_keepalive(p.keepalive_s, level, cfg.max_keepalive_s)
        if keepalive_s != p.keepalive_s:  # a 3.1.1 client held to less than it asked
            self._limit("max_keepalive_s")
        self._keepalive.interval_s = keepalive_s
        if level == 5:
            self.outbound.limit(p.properties, cfg.outbound_topic_alias_maximum)
        self.state = State.AUTHENTICATING
        method = self._auth.method = p.properties.authentication_method
        if method is not None:
            return Authenticate(p, client_id, p.properties.authentication_data or b"")
        return Authenticate(p, client_id)

    def _on_connect_auth(self, p: Auth) -> Action:
        """The client's AUTH answering our challenge during CONNECT: the next step."""
        data = self._auth.answer(p)
        connect = self._handshake.connect
        assert connect is not None, "AUTH answered before CONNECT"
        return Authenticate(connect, self.client_id, data, self._auth.state)

    def _accept(self, outcome: ConnectOutcome, now: float) -> bytes:
        """Take on the session the service granted; the CONNACK to write."""
        self.tenant = outcome.tenant
        self.epoch = outcome.epoch
        self.qos2_fence = outcome.qos2_fence
        self.incarnation = outcome.incarnation
        self.session_expiry_s = outcome.session_expiry_s
        self.persistent = outcome.session_expiry_s > 0 or outcome.session_present
        self.acl = acl = AclChecker(list(outcome.acl), outcome.acl_default_allow)
        self._auth.identity = outcome.identity
        self.state = State.CONNECTED
        self._decoder.max_packet_size = self.config.max_packet_size_bytes
        self._keepalive.last_rx = now
        connack, keepalive_s = self._handshake.connack(outcome, self.client_id)
        if keepalive_s is not None:
            self._keepalive.interval_s = keepalive_s
            asked_s = self._handshake.connect.keepalive_s if self._handshake.connect else 0
            self._limit("max_keepalive_s" if asked_s else "server_keepalive_s")
        gate = self._gates(self.tenant, outcome.identity.partition("/")[2]) if self._gates else None
        self._inbound.start(
            self.level,
            self.tenant,
            self.client_id,
            acl,
            self.persistent,
            outcome.awaiting_release if outcome.session_present else (),
            gate,
        )
        quota = gate.limits if gate is not None else None
        delivery = gate.delivery if gate is not None else None
        if delivery is not None:
            delivery.wake = self.on_resume
            delivery.attach = self._attach_delivery
            delivery.refresh()
        self._subscriptions.start(self.level, acl, outcome.subscriptions, quota)
        return encode(connack, self.level)

    def _attach_delivery(self, gate: DeliveryGate | None) -> None:
        """The outbound bandwidth gate while its budgets may limit, None otherwise: a tenant
        without the limit pays nothing per delivery (DeliveryGate.refresh)."""
        self.outbound.gate = gate

    def _release_connack(self) -> None:
        """ACCEPTED -> CONNECTED: write the CONNACK that waited."""
        self.out += self._handshake.take_connack()
        self.state = State.CONNECTED

    def _refuse(self, code: int, why: str = "") -> Close:
        """Refuse the CONNECT: CONNACK with `code` (the v3 return code on 3.1/3.1.1, which
        close without CONNACK on a protocol error [MQTT-3.1.4-1]: they have no code for it);
        `why`: its Reason String (MQTT 5), by default the code's description."""
        self.state = State.AUTHENTICATING  # so `_shut` answers MQTT 5 with a CONNACK
        if self.level < 5:
            if code in _V3_CLOSE_ONLY:
                return self._close(code, describe(code))
            self.out += encode(ConnAck(False, code), self.level)
        return self._shut(code, why or describe(code))

    def _fail(self, exc: MqttError) -> Close:
        """The client broke a rule (`exc` says which): close with its reason code."""
        self._count_limit(exc)
        if self.state is State.AWAIT_CONNECT:
            if isinstance(exc.cause, UnsupportedProtocolVersionError):
                self.out += _V3_UNACCEPTABLE_PROTOCOL  # [MQTT-3.1.2-2] return code 1, then close
            elif self._decoder.protocol_level == 5 and isinstance(
                exc.cause, PacketTooLargeError | QuotaExceededError
            ):
                # A CONNECT over our limits that says MQTT 5: CONNACK 0x95 / 0x97 tells the
                # client why before the close [MQTT-4.13.1-1].
                self.out += encode(ConnAck(False, exc.reason_code), 5)
            return self._close(exc.reason_code, str(exc))
        return self._shut(exc.reason_code, str(exc))

    def _count_limit(self, exc: MqttError) -> None:
        """Report the configured limit `exc` enforces, if any."""
        limit = exc.limit
        if limit == "max_packet_size" and self.state is not State.CONNECTED:
            limit = "max_connect_packet_size_bytes"  # the decoder's size before CONNACK
        elif limit == "max_packet_size":
            limit = "max_packet_size_bytes"
        if limit:
            self._limit(_DECODER_LIMITS.get(limit, limit))

    def _count_will_topic_limit(self, topic: str) -> None:
        """The will topic was refused: report it if a length/levels limit refused it."""
        try:
            validate_topic_name(topic, self.config.topic_limits)
        except MqttError as exc:
            self._count_limit(exc)

    def _shut(self, code: int, reason: str, server_reference: str = "") -> Close:
        """Tell an MQTT 5 client why (DISCONNECT, or CONNACK before the session exists),
        then close. Not for a CLOSED channel."""
        if self.state is State.ACCEPTED:
            self._release_connack()  # the session exists: CONNACK, then DISCONNECT
        if self.level == 5:
            problems = self._problems
            if self.state is State.CONNECTED:
                props = Properties(server_reference=server_reference) if server_reference else EMPTY
                self.out += problems.encode(Disconnect(code, props), reason, always=True)
            elif self.state is State.AUTHENTICATING and code >= 0x80:
                self.out += problems.encode(self._handshake.refused(code), reason, always=True)
        return self._close(code, reason)

    def _close(self, code: int, reason: str) -> Close:
        self.state = State.CLOSED
        return Close(code, reason)

    # ---- packets of a connected client ---------------------------------------------------

    def _control_budget(self, p: Packet, now: float) -> bool:
        """False when `p` is one control packet too many (ChannelConfig.control_packets_*).
        A PUBLISH never comes here; an ack of an exchange under way and DISCONNECT are free:
        their number is bounded by the exchanges. Everything else costs a token: each is
        cheap, but a flood of them (a million PUBACKs of unknown ids in a second) would hold
        the node's event loop for seconds, every other client's traffic behind it."""
        rate = self.config.control_packets_per_s
        if not rate:
            return True
        t = type(p)
        if t is Disconnect:
            return True
        stage = _ACK_STAGE.get(t)
        if stage is not None:
            # Free only where it moves an exchange on: a repeat, or an ack of another stage,
            # changes nothing and costs a token like any other.
            if self.outbound.inflight.get(p.packet_id) == stage:  # type: ignore[attr-defined]
                return True
        elif t is PubRel and self._inbound.awaiting(p.packet_id):  # type: ignore[attr-defined]
            return True
        burst = self.config.control_packets_burst
        # A wall clock stepped back refills nothing, and takes nothing either.
        elapsed = max(0.0, now - self._control_at)
        tokens = min(burst, self._control_tokens + elapsed * rate)
        self._control_at = now
        if tokens < 1:
            self._control_tokens = tokens
            return False
        self._control_tokens = tokens - 1
        return True

    def _on_pubrel(self, p: PubRel, now: float) -> Action | None:
        return self._inbound.on_pubrel(p)

    def _on_puback(self, p: PubAck, now: float) -> Action | None:
        return _PROGRESS if self.outbound.on_puback(p.packet_id, now) else None

    def _on_pubrec(self, p: PubRec, now: float) -> Action | None:
        return _PROGRESS if self.outbound.on_pubrec(p.packet_id, p.reason_code, now) else None

    def _on_pubcomp(self, p: PubComp, now: float) -> Action | None:
        return _PROGRESS if self.outbound.on_pubcomp(p.packet_id, now) else None

    def _on_subscribe(self, p: Subscribe, now: float) -> Action:
        return self._subscriptions.on_subscribe(p)

    def _on_unsubscribe(self, p: Unsubscribe, now: float) -> Action:
        return self._subscriptions.on_unsubscribe(p)

    def _on_pingreq(self, p: PingReq, now: float) -> None:
        self.out += PINGRESP

    def _on_disconnect(self, p: Disconnect, now: float) -> Action:
        connect = self._handshake.connect
        asked_s = connect.properties.session_expiry_interval if connect else None
        farewell = read_disconnect(p, self.level, asked_s)
        if farewell.discard_will:
            self.will = None
            self.normal_disconnect = True
        if farewell.session_expiry_s is not None:
            self.disconnect_expiry_s = farewell.session_expiry_s
        if farewell.violation:
            raise ProtocolViolationError(farewell.violation)
        return self._close(p.reason_code, "client disconnected")

    def _on_auth(self, p: Auth, now: float) -> Action:
        auth = self._auth
        if p.reason_code == RC.RE_AUTHENTICATE:
            data = auth.begin_reauthentication(p)
            state = b""
        else:
            state = auth.state
            data = auth.answer(p)
        assert auth.method is not None  # both calls above check it
        return Reauthenticate(auth.method, data, state, auth.identity)


# What a CONNECTED channel does with each packet type (PUBLISH takes a shortcut before this).
_DISPATCH: dict[type, Callable[[Channel, Any, float], Action | None]] = {
    PubAck: Channel._on_puback,
    PubRec: Channel._on_pubrec,
    PubRel: Channel._on_pubrel,
    PubComp: Channel._on_pubcomp,
    Subscribe: Channel._on_subscribe,
    Unsubscribe: Channel._on_unsubscribe,
    PingReq: Channel._on_pingreq,
    Disconnect: Channel._on_disconnect,
    Auth: Channel._on_auth,
}
