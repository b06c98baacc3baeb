"""MQTT 5 properties (spec 2.2.2): identifiers, types, where each may appear, and the value type.

`Properties` is one frozen record for every packet; absent properties are None (or empty
tuples for the two repeatable ones). `EMPTY` is shared so property-less packets allocate nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Final

from services.common.mqtt.reason import PacketType as PT

# Pseudo packet type for the will properties inside CONNECT.
WILL: Final = 0


class PropKind(IntEnum):
    BYTE = 1
    U16 = 2
    U32 = 3
    VARINT = 4
    UTF8 = 5
    BINARY = 6
    PAIR = 7


class PropId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


_ACKS = frozenset({PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP})
_ALL = frozenset({*PT, WILL})


@dataclass(frozen=True, slots=True)
class PropSpec:
    ident: int
    name: str
    kind: PropKind
    allowed_in: frozenset[int]


def _spec(ident: PropId, kind: PropKind, *where: int | frozenset[int]) -> PropSpec:
    allowed: set[int] = set()
    for w in where:
        allowed |= w if isinstance(w, frozenset) else {w}
    return PropSpec(int(ident), ident.name.lower(), kind, frozenset(allowed))


# The table of spec section 2.2.2.2: identifier, type and the packets it may appear in.
PROPERTY_SPECS: Final[dict[int, PropSpec]] = {
    s.ident: s
    for s in (
        _spec(PropId.PAYLOAD_FORMAT_INDICATOR, PropKind.BYTE, PT.PUBLISH, WILL),
        _spec(PropId.MESSAGE_EXPIRY_INTERVAL, PropKind.U32, PT.PUBLISH, WILL),
        _spec(PropId.CONTENT_TYPE, PropKind.UTF8, PT.PUBLISH, WILL),
        _spec(PropId.RESPONSE_TOPIC, PropKind.UTF8, PT.PUBLISH, WILL),
        _spec(PropId.CORRELATION_DATA, PropKind.BINARY, PT.PUBLISH, WILL),
        _spec(PropId.SUBSCRIPTION_IDENTIFIER, PropKind.VARINT, PT.PUBLISH, PT.SUBSCRIBE),
        _spec(PropId.SESSION_EXPIRY_INTERVAL, PropKind.U32, PT.CONNECT, PT.CONNACK, PT.DISCONNECT),
        _spec(PropId.ASSIGNED_CLIENT_IDENTIFIER, PropKind.UTF8, PT.CONNACK),
        _spec(PropId.SERVER_KEEP_ALIVE, PropKind.U16, PT.CONNACK),
        _spec(PropId.AUTHENTICATION_METHOD, PropKind.UTF8, PT.CONNECT, PT.CONNACK, PT.AUTH),
        _spec(PropId.AUTHENTICATION_DATA, PropKind.BINARY, PT.CONNECT, PT.CONNACK, PT.AUTH),
        _spec(PropId.REQUEST_PROBLEM_INFORMATION, PropKind.BYTE, PT.CONNECT),
        _spec(PropId.WILL_DELAY_INTERVAL, PropKind.U32, WILL),
        _spec(PropId.REQUEST_RESPONSE_INFORMATION, PropKind.BYTE, PT.CONNECT),
        _spec(PropId.RESPONSE_INFORMATION, PropKind.UTF8, PT.CONNACK),
        _spec(PropId.SERVER_REFERENCE, PropKind.UTF8, PT.CONNACK, PT.DISCONNECT),
        _spec(
            PropId.REASON_STRING,
            PropKind.UTF8,
            PT.CONNACK,
            _ACKS,
            PT.SUBACK,
            PT.UNSUBACK,
            PT.DISCONNECT,
            PT.AUTH,
        ),
        _spec(PropId.RECEIVE_MAXIMUM, PropKind.U16, PT.CONNECT, PT.CONNACK),
        _spec(PropId.TOPIC_ALIAS_MAXIMUM, PropKind.U16, PT.CONNECT, PT.CONNACK),
        _spec(PropId.TOPIC_ALIAS, PropKind.U16, PT.PUBLISH),
        _spec(PropId.MAXIMUM_QOS, PropKind.BYTE, PT.CONNACK),
        _spec(PropId.RETAIN_AVAILABLE, PropKind.BYTE, PT.CONNACK),
        _spec(PropId.USER_PROPERTY, PropKind.PAIR, _ALL),
        _spec(PropId.MAXIMUM_PACKET_SIZE, PropKind.U32, PT.CONNECT, PT.CONNACK),
        _spec(PropId.WILDCARD_SUBSCRIPTION_AVAILABLE, PropKind.BYTE, PT.CONNACK),
        _spec(PropId.SUBSCRIPTION_IDENTIFIER_AVAILABLE, PropKind.BYTE, PT.CONNACK),
        _spec(PropId.SHARED_SUBSCRIPTION_AVAILABLE, PropKind.BYTE, PT.CONNACK),
    )
}
SPEC_BY_NAME: Final[dict[str, PropSpec]] = {s.name: s for s in PROPERTY_SPECS.values()}

# Only these two may appear more than once in one packet [MQTT-2.2.2-1 and 3.3.2.3.8].
REPEATABLE: Final = frozenset({PropId.USER_PROPERTY, PropId.SUBSCRIPTION_IDENTIFIER})
# Byte properties whose only legal values are 0 and 1.
BOOLEAN_BYTES: Final = frozenset(
    {
        PropId.PAYLOAD_FORMAT_INDICATOR,
        PropId.REQUEST_PROBLEM_INFORMATION,
        PropId.REQUEST_RESPONSE_INFORMATION,
        PropId.MAXIMUM_QOS,
        PropId.RETAIN_AVAILABLE,
        PropId.WILDCARD_SUBSCRIPTION_AVAILABLE,
        PropId.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        PropId.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
# Properties where zero is a protocol error.
NONZERO: Final = frozenset(
    {
        PropId.RECEIVE_MAXIMUM,  # [MQTT-3.1.2-... receive maximum 0 is a protocol error]
        PropId.MAXIMUM_PACKET_SIZE,
        PropId.SUBSCRIPTION_IDENTIFIER,  # [MQTT-3.8.2.1.2] 0 is a protocol error
        PropId.TOPIC_ALIAS,  # [MQTT-3.3.2-8]
    }
)

UserProperties = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Properties:
    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifier: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_property: UserProperties = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def present(self) -> list[tuple[PropSpec, object]]:
        """(spec, value) for every property that is set, in identifier order."""
        out: list[tuple[PropSpec, object]] = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or v == ():
                continue
            out.append((SPEC_BY_NAME[f.name], v))
        out.sort(key=lambda p: p[0].ident)
        return out

    def is_empty(self) -> bool:
        return self == EMPTY


EMPTY: Final = Properties()
