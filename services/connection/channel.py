"""Per-client MQTT state machine for 3.1, 3.1.1 and 5.0: bytes and ticks in, bytes and actions
out. It never awaits and never touches a socket; `listener.py` and `node.py` are its shell.

Theory of operation:
- `receive(data, now)` decodes and handles packets; replies go to `out` (bytes to write),
  messages for the mesh go to `publishes`, everything that needs I/O goes to `actions`.
- CONNECT yields `Authenticate`; packets that arrive before `on_authenticated` are held and
  replayed afterwards, in order.
- SUBSCRIBE yields `SubscribeRequest`; the SUBACK is written by `on_subscribed` once the node
  has its mesh subscriptions in place, so a publish after SUBACK is never missed.
- Any protocol error closes only this connection: DISCONNECT with the reason code on MQTT 5
  (CONNACK with it before the session exists), a plain close on 3.1/3.1.1.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum

from services.common.acl import AclChecker
from services.common.mqtt.decoder import DEFAULT_MAX_PACKET_SIZE, Decoder
from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import MqttError, UnsupportedProtocolVersionError
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
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.primitives import check_utf8
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import (
    DEFAULT_LIMITS,
    TopicLimits,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)
from services.connection.actions import (
    Action,
    Authenticate,
    AuthResult,
    Close,
    Message,
    SubscribeRequest,
    Unsubscribed,
    message_properties,
)
from services.connection.outbound import AWAIT_PUBACK, AWAIT_PUBCOMP, Outbound


class State(IntEnum):
    AWAIT_CONNECT = 1
    AUTHENTICATING = 2
    CONNECTED = 3
    CLOSED = 4


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    node_id: str = "node"
    max_packet_size_bytes: int = DEFAULT_MAX_PACKET_SIZE
    receive_maximum: int = 1024  # inbound QoS 2 window we announce
    topic_alias_maximum: int = 64  # inbound aliases we accept
    max_keepalive_s: int = 0  # 0: accept what the client asks
    connect_timeout_s: float = 10.0
    v3_inflight: int = 256  # outbound window for clients that cannot tell us theirs
    max_queued_messages: int = 1000
    max_client_id_length: int = 256
    max_held_packets: int = 1000
    # PUBACK/PUBREC of forwarded QoS 1/2 publishes wait for `ack_publish` (the node acks once
    # the router has stored the message in every matching persistent queue).
    defer_publish_acks: bool = False
    topic_limits: TopicLimits = field(default=DEFAULT_LIMITS)


class Channel:
    def __init__(self, config: ChannelConfig, peer: str, now: float) -> None:
        self.config = config
        self.peer = peer
        self.state = State.AWAIT_CONNECT
        self.opened_at = now
        self.last_rx = now
        self.level = 4
        self.decoder = Decoder(4, config.max_packet_size_bytes)
        self.out = bytearray()
        self.publishes: list[Message] = []
        self.actions: list[Action] = []
        self.client_id = ""
        self.username = ""
        self.tenant = ""
        self.epoch = 0
        self.keepalive_s = 0
        self.clean_start = True
        self.will: Will | None = None
        self.normal_disconnect = False
        self.acl = AclChecker([], True)
        self.subscriptions: dict[str, int | None] = {}  # filter -> subscription id
        self.outbound = Outbound(
            self.out,
            4,
            config.v3_inflight,
            config.max_packet_size_bytes,
            0,
            config.max_queued_messages,
        )
        self._alias_in: dict[int, str] = {}
        self._awaiting_rel: set[int] = set()
        self._held: list[Packet] = []
        self._connect: Connect | None = None
        # Publisher acks in receipt order [MQTT-4.6.0-2]: [packet id, qos, reason, ready].
        # A list, not a deque: it is short and an empty deque costs 760 bytes per connection.
        self._acks: list[list[int]] = []
        self.persistent = False
        self.incarnation = 0
        self.session_expiry_s = 0
        self.disconnect_expiry_s: int | None = None

    # ---- input -------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> None:
        if self.state is State.CLOSED:
            return
        self.last_rx = now
        try:
            packets = self.decoder.feed(data)
        except MqttError as exc:
            for p in exc.packets:
                self._handle(p, now)  # type: ignore[arg-type]
            if self.state is not State.CLOSED:
                self._fail(exc, now)
            return
        for p in packets:
            self._handle(p, now)

    def _handle(self, p: Packet, now: float) -> None:
        state = self.state
        if state is State.CONNECTED:
            if type(p) is Publish:
                self._on_publish(p, now)
                return
            handler = _HANDLERS.get(type(p))
            if handler is None:
                self.protocol_error(f"unexpected {type(p).__name__} from client", now)
            else:
                handler(self, p, now)
        elif state is State.AWAIT_CONNECT:
            if type(p) is not Connect:
                self._close(RC.PROTOCOL_ERROR, "first packet must be CONNECT")  # [MQTT-3.1.0-1]
                return
            self._on_connect(p, now)
        elif state is State.AUTHENTICATING:
            if len(self._held) >= self.config.max_held_packets:
                self.protocol_error("too many packets before CONNACK", now)
                return
            self._held.append(p)

    def _fail(self, exc: MqttError, now: float) -> None:
        if self.state is State.AWAIT_CONNECT:
            if isinstance(exc.cause, UnsupportedProtocolVersionError):
                self.out += b"\x20\x02\x00\x01"  # [MQTT-3.1.2-2] return code 1, then close
                self._close(exc.reason_code, str(exc))
            else:
                self._close(exc.reason_code, str(exc))
            return
        self.protocol_error(str(exc), now, exc.reason_code)

    def protocol_error(self, reason: str, now: float, code: int = RC.PROTOCOL_ERROR) -> None:
        self.disconnect(code, reason)

    def disconnect(self, code: int, reason: str) -> None:
        """Server-initiated close: DISCONNECT(code) on MQTT 5, then close."""
        if self.state is State.CLOSED:
            return
        if self.state is State.CONNECTED and self.level == 5:
            self.out += encode(Disconnect(code), 5)
        elif self.state is State.AUTHENTICATING and self.level == 5 and code >= 0x80:
            self.out += encode(ConnAck(False, code), 5)
        self._close(code, reason)

    def _close(self, code: int, reason: str) -> None:
        self.state = State.CLOSED
        self.actions.append(Close(code, reason))

    # ---- connect -------------------------------------------------------------------------

    def _on_connect(self, p: Connect, now: float) -> None:
        self.level = level = p.protocol_level
        self.outbound.level = level
        props = p.properties
        client_id = p.client_id
        refuse = 0
        if len(client_id) > self.config.max_client_id_length:
            refuse = RC.CLIENT_IDENTIFIER_NOT_VALID
        elif not client_id:
            if level == 3 or (level == 4 and not p.clean_start):
                refuse = RC.CLIENT_IDENTIFIER_NOT_VALID  # [MQTT-3.1.3-8]
            else:
                client_id = "auto-" + uuid.uuid4().hex  # [MQTT-3.1.3-6]
        if props.authentication_method is not None:
            refuse = RC.BAD_AUTHENTICATION_METHOD  # no enhanced auth methods configured
        if p.will is not None and not refuse:
            try:
                validate_topic_name(p.will.topic, self.config.topic_limits)
            except MqttError:
                refuse = RC.TOPIC_NAME_INVALID
            if p.will.properties.payload_format_indicator == 1:
                try:
                    check_utf8(p.will.payload)
                except MqttError:
                    refuse = RC.PAYLOAD_FORMAT_INVALID
        if refuse:
            self.state = State.AUTHENTICATING  # so disconnect() answers with CONNACK
            if level < 5:
                self.out += encode(ConnAck(False, refuse), level)
            self.disconnect(refuse, "connect refused")
            return
        self._connect = p
        self.client_id = client_id
        self.username = p.username or ""
        self.keepalive_s = p.keepalive_s
        self.clean_start = p.clean_start
        self.will = p.will
        if level == 5:
            self.outbound.receive_maximum = props.receive_maximum or 65535
            self.outbound.max_packet_size = props.maximum_packet_size or (1 << 28)
            self.outbound.alias_max = props.topic_alias_maximum or 0
        self.state = State.AUTHENTICATING
        self.actions.append(Authenticate(p, client_id))

    def on_authenticated(self, result: AuthResult, now: float) -> None:
        if self.state is not State.AUTHENTICATING:
            return
        p = self._connect
        assert p is not None
        level = self.level
        if not result.ok:
            if level < 5:
                self.out += encode(ConnAck(False, result.reason_code), level)
            self.will = None  # no will for a refused connection [MQTT-3.1.4-... ]
            self.disconnect(result.reason_code, "connect refused")
            return
        self.tenant = result.tenant
        self.epoch = result.epoch
        self.acl = AclChecker(list(result.acl), result.acl_default_allow)
        self.state = State.CONNECTED
        self.last_rx = now
        props = EMPTY
        if level == 5:
            cfg = self.config
            keepalive = None
            if cfg.max_keepalive_s and (p.keepalive_s == 0 or p.keepalive_s > cfg.max_keepalive_s):
                keepalive = self.keepalive_s = cfg.max_keepalive_s
            props = Properties(
                assigned_client_identifier=self.client_id if not p.client_id else None,
                receive_maximum=cfg.receive_maximum,
                topic_alias_maximum=cfg.topic_alias_maximum,
                maximum_packet_size=cfg.max_packet_size_bytes,
                server_keep_alive=keepalive,
                # Only when the server uses another value than the client asked for.
                session_expiry_interval=(
                    result.session_expiry_s
                    if result.session_expiry_s != (p.properties.session_expiry_interval or 0)
                    else None
                ),
            )
        self.out += encode(ConnAck(result.session_present, 0, props), level)
        self.incarnation = result.incarnation
        self.session_expiry_s = result.session_expiry_s
        self.persistent = result.session_expiry_s > 0
        for sub, sub_id in result.subscriptions:
            self.subscriptions[sub.filter] = sub_id
        held, self._held = self._held, []
        for packet in held:
            if self.state is not State.CONNECTED:
                break
            self._handle(packet, now)

    # ---- publish from the client ---------------------------------------------------------

    def _on_publish(self, p: Publish, now: float) -> None:
        topic = p.topic
        qos = p.qos
        props = p.properties
        level = self.level
        if level == 5 and props is not EMPTY:
            alias = props.topic_alias
            if alias is not None:
                if alias > self.config.topic_alias_maximum:
                    self.disconnect(RC.TOPIC_ALIAS_INVALID, "topic alias out of range")
                    return  # [MQTT-3.3.2-9]
                if topic:
                    self._alias_in[alias] = topic
                else:
                    topic = self._alias_in.get(alias, "")
                    if not topic:
                        self.protocol_error("unknown topic alias", now)  # [MQTT-3.3.4-... ]
                        return
        try:
            validate_topic_name(topic, self.config.topic_limits)
        except MqttError as exc:
            if level == 5:
                self.disconnect(RC.TOPIC_NAME_INVALID, str(exc))
            else:
                self._close(RC.TOPIC_NAME_INVALID, str(exc))
            return
        pid = p.packet_id or 0
        if qos == 2:
            if pid in self._awaiting_rel:
                # A resend: never forward twice; answer unless the first PUBREC is pending.
                if not any(a[0] == pid for a in self._acks):
                    self.out += encode(PubRec(pid), level)
                return
            if len(self._awaiting_rel) >= self.config.receive_maximum:
                self.disconnect(RC.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
                return
        code = 0
        forward = True
        if not self.acl.can_publish(topic):
            forward = False
            code = RC.NOT_AUTHORIZED if level == 5 else 0  # 3.1.1: acknowledge, then drop
        elif props.payload_format_indicator == 1:
            try:
                check_utf8(p.payload)
            except MqttError:
                forward = False
                code = RC.PAYLOAD_FORMAT_INVALID
        defer = forward and qos > 0 and self.config.defer_publish_acks
        if forward:
            mprops = EMPTY
            expires_at = None
            if props is not EMPTY:
                mprops = message_properties(props)
                if props.message_expiry_interval is not None:
                    expires_at = now + props.message_expiry_interval
            self.publishes.append(
                Message(
                    self.tenant,
                    topic,
                    p.payload,
                    qos,
                    p.retain,
                    self.client_id,
                    mprops,
                    expires_at,
                    now,
                    (),
                    pid if defer else 0,
                )
            )
        if qos == 0:
            return
        if qos == 2 and code < 0x80:
            self._awaiting_rel.add(pid)
        self._acks.append([pid, qos, code, 0 if defer else 1])
        self._flush_acks()

    def ack_publish(self, pid: int, code: int = 0) -> None:
        """The node finished routing a deferred publish: its PUBACK/PUBREC may go."""
        for a in self._acks:
            if a[0] == pid and not a[3]:
                a[2], a[3] = code, 1
                break
        self._flush_acks()

    def _flush_acks(self) -> None:
        acks = self._acks
        level = self.level
        n = 0
        connected = self.state is State.CONNECTED
        for pid, qos, code, ready in acks:
            if not ready:
                break
            n += 1
            if not connected:
                continue
            if qos == 1:
                self.out += encode(PubAck(pid, code), level)
            else:
                if code >= 0x80:
                    self._awaiting_rel.discard(pid)
                self.out += encode(PubRec(pid, code), level)
        if n:
            del acks[:n]

    def _on_pubrel(self, p: PubRel, now: float) -> None:
        if p.packet_id in self._awaiting_rel:
            self._awaiting_rel.discard(p.packet_id)
            self.out += encode(PubComp(p.packet_id), self.level)
        else:
            self.out += encode(PubComp(p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND), self.level)

    # ---- acks of our deliveries ----------------------------------------------------------

    def _on_puback(self, p: PubAck, now: float) -> None:
        self.outbound.acked(p.packet_id, AWAIT_PUBACK, now)

    def _on_pubrec(self, p: PubRec, now: float) -> None:
        if not self.outbound.received(p.packet_id, p.reason_code >= 0x80, now):
            self.out += encode(PubRel(p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND), self.level)

    def _on_pubcomp(self, p: PubComp, now: float) -> None:
        self.outbound.acked(p.packet_id, AWAIT_PUBCOMP, now)

    def deliver(
        self, msg: Message, qos: int, retain: bool, sub_ids: tuple[int, ...], now: float
    ) -> None:
        """A message from the mesh for this client, at its effective QoS."""
        if self.state is State.CONNECTED:
            self.outbound.deliver(msg, qos, retain, sub_ids, now)

    # ---- subscriptions -------------------------------------------------------------------

    def _on_subscribe(self, p: Subscribe, now: float) -> None:
        level = self.level
        sub_id = None
        if p.properties.subscription_identifier:
            sub_id = p.properties.subscription_identifier[0]
        codes: list[int] = []
        accepted = []
        for s in p.subscriptions:
            try:
                shared = parse_shared(s.filter, self.config.topic_limits)
                if shared is None:
                    validate_topic_filter(s.filter, self.config.topic_limits)
                elif s.no_local:
                    self.protocol_error("no local on a shared subscription", now)  # 3.8.3-4
                    return
            except MqttError:
                codes.append(RC.TOPIC_FILTER_INVALID if level == 5 else 0x80)
                continue
            inner = shared.filter if shared else s.filter
            if not self.acl.can_subscribe(inner):
                codes.append(RC.NOT_AUTHORIZED if level == 5 else 0x80)
                continue
            codes.append(s.qos)
            accepted.append((s, sub_id))
        fresh = tuple(s.filter not in self.subscriptions for s, _ in accepted)
        self.actions.append(SubscribeRequest(p.packet_id, tuple(accepted), tuple(codes), fresh))

    def on_subscribed(self, request: SubscribeRequest) -> None:
        if self.state is not State.CONNECTED:
            return
        for s, sub_id in request.subscriptions:
            self.subscriptions[s.filter] = sub_id
        self.out += encode(SubAck(request.packet_id, request.reason_codes), self.level)

    def _on_unsubscribe(self, p: Unsubscribe, now: float) -> None:
        codes = []
        for f in p.filters:
            existed = self.subscriptions.pop(f, _NO_SUB) is not _NO_SUB
            codes.append(0 if existed else RC.NO_SUBSCRIPTION_EXISTED)
        self.actions.append(Unsubscribed(p.filters))
        self.out += encode(
            UnsubAck(p.packet_id, tuple(codes) if self.level == 5 else ()), self.level
        )

    # ---- the rest ----------------------------------------------------------------------

    def _on_pingreq(self, p: PingReq, now: float) -> None:
        self.out += b"\xd0\x00"

    def _on_disconnect(self, p: Disconnect, now: float) -> None:
        if p.reason_code == RC.NORMAL_DISCONNECTION:
            self.will = None  # [MQTT-3.14.4-3] a normal DISCONNECT discards the will
            self.normal_disconnect = True
        if p.properties.session_expiry_interval is not None:
            self.disconnect_expiry_s = p.properties.session_expiry_interval
        if (
            self.level == 5
            and p.properties.session_expiry_interval
            and self._connect is not None
            and not self._connect.properties.session_expiry_interval
        ):
            self.protocol_error("session expiry set on DISCONNECT after 0", now)  # 3.14.2-2
            return
        self._close(p.reason_code, "client disconnected")

    def _on_auth(self, p: Auth, now: float) -> None:
        self.protocol_error("AUTH without an authentication method", now)

    def tick(self, now: float) -> None:
        """Keep alive [MQTT-3.1.2-24]: 1.5 times the interval; CONNECT timeout."""
        if self.state is State.CONNECTED:
            if self.keepalive_s and now - self.last_rx > 1.5 * self.keepalive_s:
                self.disconnect(RC.KEEP_ALIVE_TIMEOUT, "keep alive timeout")
        elif self.state is State.AWAIT_CONNECT:
            if now - self.opened_at > self.config.connect_timeout_s:
                self._close(RC.MAXIMUM_CONNECT_TIME, "no CONNECT in time")

    def connection_lost(self) -> None:
        if self.state is not State.CLOSED:
            self.state = State.CLOSED


def requested_session_expiry(connect: Connect) -> int:
    """Session Expiry Interval a CONNECT asks for: the MQTT 5 property (absent: 0), or for
    3.1/3.1.1 "never" (0xFFFFFFFF) with clean session 0 and 0 with clean session 1."""
    if connect.protocol_level == 5:
        return connect.properties.session_expiry_interval or 0
    return 0 if connect.clean_start else 0xFFFFFFFF


_NO_SUB = object()
_HANDLERS = {
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
