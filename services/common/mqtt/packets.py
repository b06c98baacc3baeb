"""The 15 MQTT control packets as frozen records, one shape for protocol levels 3, 4 and 5.

Fields that only exist in MQTT 5 (properties, most reason codes) take their neutral value on
3.1/3.1.1; the encoder leaves them out there.

Hot packets: PUBLISH and its four acks come once or twice per message, so they are not frozen
and write their own `__init__`. Compiled (docs/compiled-core.md), a dataclass's generated
`__init__` stays Python (a frozen one sets each field through `object.__setattr__`): about
1 µs per PUBLISH; a written one is native. They are still records nobody changes after
decoding (`plain_puback` shares one PubAck per id between connections): treat them as frozen.
Equality, hashing, `repr` and `dataclasses.replace` stay the dataclass's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import PacketType, ReasonCode


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = EMPTY


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_level: int = 4
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keepalive_s: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.CONNECT


@dataclass(frozen=True, slots=True)
class ConnAck:
    session_present: bool = False
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.CONNACK


@dataclass(init=False, unsafe_hash=True, slots=True)
class Publish:
    """Not frozen, with an `__init__` of its own: see "Hot packets" above."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None
    properties: Properties

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties = EMPTY,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBLISH


@dataclass(init=False, unsafe_hash=True, slots=True)
class _FlowAck:
    """What PUBACK, PUBREC, PUBREL and PUBCOMP carry. Each is its own class (the codec and
    the channel tell them apart by type; equal fields of two kinds are not equal packets:
    the dataclass's `__eq__` compares classes first)."""

    packet_id: int
    reason_code: int
    properties: Properties

    def __init__(
        self, packet_id: int, reason_code: int = ReasonCode.SUCCESS, properties: Properties = EMPTY
    ) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties


class PubAck(_FlowAck):
    __slots__ = ()

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBACK


class PubRec(_FlowAck):
    __slots__ = ()

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBREC


class PubRel(_FlowAck):
    __slots__ = ()

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBREL


class PubComp(_FlowAck):
    __slots__ = ()

    @property
    def packet_type(self) -> PacketType:
        return PacketType.PUBCOMP


@dataclass(frozen=True, slots=True)
class Subscription:
    filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.SUBACK


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    filters: tuple[str, ...]
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int
    # Empty on 3.1/3.1.1, where UNSUBACK carries no payload.
    reason_codes: tuple[int, ...] = field(default=())
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.UNSUBACK


@dataclass(frozen=True, slots=True)
class PingReq:
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class PingResp:
    @property
    def packet_type(self) -> PacketType:
        return PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.DISCONNECT


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = EMPTY

    @property
    def packet_type(self) -> PacketType:
        return PacketType.AUTH


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
PUBLISH_ACKS = (PubAck, PubRec, PubRel, PubComp)
