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
  replayed by it, in order, so it returns actions too (opening.py).
- SUBSCRIBE yields `SubscribeRequest`; the SUBACK waits for `subscribed`.
- A client that breaks a rule makes a family raise `MqttError` (its reason code says why);
  only this connection closes (closing.py).
- Until the CONNECT is accepted the decoder allows `max_connect_packet_size_bytes` only: a
  peer nobody knows yet cannot make us read a large packet. Every configured limit a client
  exceeds is reported through `on_limit(setting name, tenant)` (the node counts them; the
  tenant is "" before authentication).
- `state` only moves forward (state.py). Nothing is written or returned after CLOSED.
- `Channel` is one class written in three modules, each a base of the next: closing.py,
  opening.py, then this one (the packets of a connected client, and the shell's calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, cast

from services.common.acl import AclChecker
from services.common.message import Message
from services.common.mqtt.body_decoder import DecodeLimits
from services.common.mqtt.decoder import Decoder
from services.common.mqtt.errors import MqttError, ProtocolViolationError
from services.common.mqtt.packets import (
    Auth,
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
)
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel.actions import (
    Action,
    DeliveryProgress,
    Reauthenticate,
    Route,
    SubscribeRequest,
)
from services.connection.channel.config import ChannelConfig
from services.connection.channel.control import (
    PINGRESP,
    ControlBudget,
    KeepAlive,
    read_disconnect,
)
from services.connection.channel.enhanced_auth import AuthExchange
from services.connection.channel.handshake import Handshake
from services.connection.channel.hooks import DeliveryHooks
from services.connection.channel.inbound import InboundPublishes, PublishGate
from services.connection.channel.opening import ChannelOpening
from services.connection.channel.outbound import Outbound
from services.connection.channel.problems import Problems
from services.connection.channel.state import BEFORE_CONNACK, State
from services.connection.channel.subscriptions import ClientSubscriptions

__all__ = ["Channel", "State"]

_PROGRESS: Final = DeliveryProgress()  # it carries nothing: one instance serves every channel


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


class Channel(ChannelOpening):
    """One client connection's MQTT logic. Feed it with `receive`, `authenticated`,
    `subscribed`, `publish_routed`, `deliver` and `tick`; write `out`; carry out the actions."""

    __slots__ = ()  # the fields are ChannelBase's (state.py)

    def __init__(
        self,
        config: ChannelConfig,
        peer: str,
        now: float,
        new_client_id: Callable[[], str],
        *,
        on_limit: Callable[[str, str], None] = _uncounted,
        gates: Callable[[str, str, DeliveryHooks], PublishGate | None] | None = None,
        on_resume: Callable[[], None] = _nothing,
    ) -> None:
        """`gates(tenant, user, hooks)`: the publish budgets of an accepted connection (None: no
        rate limits); `on_resume()`: held deliveries may move again (the outbound bandwidth
        budget has tokens: see Outbound.gate), the shell sends them."""
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
        self.incarnation = 0
        # The session has a stored record and queue: it outlives the connection, or it was
        # resumed (then its queue is delivered even if the new expiry is 0 [MQTT-3.1.2-4]).
        self.persistent = False
        self.session_expiry_s = 0
        self.disconnect_expiry_s = None  # set by the client's DISCONNECT
        self.will = None
        self.normal_disconnect = False
        self.acl = AclChecker([], True)
        self.on_resume = on_resume
        self._build_parts(config, now, new_client_id)

    def _build_parts(
        self, config: ChannelConfig, now: float, new_client_id: Callable[[], str]
    ) -> None:
        """The modules that own the packet families, timers and budgets of this channel."""
        self.outbound = Outbound(
            out=self.out,
            level=4,
            receive_maximum=config.v3_inflight,
            max_packet_size=config.max_packet_size_bytes,
            alias_max=0,
            max_queued=config.max_queued_messages,
            max_queued_bytes=config.max_queued_bytes,
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
        self._control = ControlBudget(
            config.control_packets_per_s, config.control_packets_burst, now
        )

    @property
    def identity(self) -> str:
        """`tenant/name` the connection authenticated as ("" before, or anonymous)."""
        return self._auth.identity

    @property
    def subscriptions(self) -> dict[str, int | None]:
        """Filter -> Subscription Identifier of everything the client is subscribed to."""
        return self._subscriptions.filters

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
            if not self._control.allows(p, now, self.outbound.inflight, self._inbound):
                self._on_limit("control_packets_per_s", self.tenant)
                return self._shut(RC.MESSAGE_RATE_TOO_HIGH, "too many control packets")
            return handler(self, p, now)
        if state is State.AWAIT_CONNECT:
            if type(p) is not Connect:  # [MQTT-3.1.0-1]
                return self._close(RC.PROTOCOL_ERROR, "first packet must be CONNECT")
            return self._on_connect(p)
        if state is State.AUTHENTICATING and type(p) is Auth and self.level == 5:
            return self._on_connect_auth(p)
        if state in BEFORE_CONNACK and not self._handshake.hold(p):
            raise ProtocolViolationError("too many packets before CONNACK")
        return None

    # ---- packets of a connected client ---------------------------------------------------

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
_DISPATCH: Final[dict[type, Callable[[Channel, Any, float], Action | None]]] = {
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
