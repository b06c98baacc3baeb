"""Encoding of every packet to bytes.

`encode(packet, level)` is the one entry point; `encode_publish` and `frame_publish` are exposed
for the fan-out hot path. MQTT 5-only fields are left out on levels 3 and 4.
"""

from __future__ import annotations

import struct
from typing import Final

from services.common.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from services.common.mqtt.primitives import encode_binary, encode_str, encode_varint
from services.common.mqtt.properties import EMPTY, Properties, PropKind
from services.common.mqtt.reason import v3_connack_code

_NO_PROPS: Final = b"\x00"
# PUBLISH framing: struct packing is about twice as fast as int.to_bytes plus bytes((...)).
_SHORT_HEADER: Final = struct.Struct(
    ">BBH"
).pack  # first byte, remaining length < 128, topic length
_U16: Final = struct.Struct(">H").pack


def encode_properties(props: Properties) -> bytes:
    if props is EMPTY:
        return _NO_PROPS
    out = bytearray()
    for spec, value in props.present():
        kind = spec.kind
        values = value if spec.name in ("user_property", "subscription_identifier") else (value,)
        for v in values:  # type: ignore[attr-defined]
            out += encode_varint(spec.ident)
            if kind is PropKind.BYTE:
                out.append(v)
            elif kind is PropKind.U16:
                out += v.to_bytes(2, "big")
            elif kind is PropKind.U32:
                out += v.to_bytes(4, "big")
            elif kind is PropKind.VARINT:
                out += encode_varint(v)
            elif kind is PropKind.UTF8:
                out += encode_str(v)
            elif kind is PropKind.BINARY:
                out += encode_binary(v)
            else:
                out += encode_str(v[0]) + encode_str(v[1])
    return encode_varint(len(out)) + bytes(out)


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def frame_publish(
    first: int, topic: bytes, packet_id: int, properties: bytes | None, payload: bytes
) -> bytes:
    """A PUBLISH from its parts: the one framing of PUBLISH, shared by `encode_publish` and the
    connection node's delivery writer, which brings its own properties (alias, expiry left).

    `first` is the fixed header byte (0x30 | QoS << 1 | DUP << 3 | RETAIN); the packet id is
    written only when its QoS bits are set; `properties` is the encoded property section on
    MQTT 5 and None on 3.1/3.1.1, which have none.
    """
    n = 2 + len(topic) + len(payload)  # remaining length
    qos = first & 0x06
    if qos:
        n += 2
    if properties is not None:
        n += len(properties)
    if n < 128:  # one-byte remaining length: the common case, one struct call for 4 bytes
        data = _SHORT_HEADER(first, n, len(topic)) + topic
    else:
        data = bytes((first,)) + encode_varint(n) + _U16(len(topic)) + topic
    if qos:  # [MQTT-2.2.1-2] no packet id at QoS 0
        data += _U16(packet_id)
    if properties is not None:
        data += properties
    return data + payload


def encode_publish(p: Publish, level: int) -> bytes:
    first = 0x30 | (p.qos << 1) | (8 if p.dup else 0) | (1 if p.retain else 0)
    props = None
    if level == 5:
        props = _NO_PROPS if p.properties is EMPTY else encode_properties(p.properties)
    return frame_publish(first, p.topic.encode(), p.packet_id or 0, props, p.payload)


def _encode_connect(p: Connect, level: int) -> bytes:
    flags = 0x02 if p.clean_start else 0
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    body = bytearray(encode_str(p.protocol_name))
    body.append(p.protocol_level)
    body.append(flags)
    body += p.keepalive_s.to_bytes(2, "big")
    if level == 5:
        body += encode_properties(p.properties)
    body += encode_str(p.client_id)
    if p.will is not None:
        if level == 5:
            body += encode_properties(p.will.properties)
        body += encode_str(p.will.topic) + encode_binary(p.will.payload)
    if p.username is not None:
        body += encode_str(p.username)
    if p.password is not None:
        body += encode_binary(p.password)
    return _frame(0x10, bytes(body))


def _encode_connack(p: ConnAck, level: int) -> bytes:
    if level == 5:
        body = bytes((int(p.session_present), p.reason_code)) + encode_properties(p.properties)
    else:
        body = bytes((int(p.session_present), v3_connack_code(p.reason_code)))
    return _frame(0x20, body)


def _encode_ack(first: int, p: PubAck | PubRec | PubRel | PubComp, level: int) -> bytes:
    pid = p.packet_id.to_bytes(2, "big")
    if level < 5 or (p.reason_code == 0 and p.properties is EMPTY):
        return bytes((first, 2)) + pid  # [MQTT-3.4.2.1] reason and properties may be omitted
    if p.properties is EMPTY:
        return bytes((first, 3)) + pid + bytes((p.reason_code,))
    return _frame(first, pid + bytes((p.reason_code,)) + encode_properties(p.properties))


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    body = bytearray(p.packet_id.to_bytes(2, "big"))
    if level == 5:
        body += encode_properties(p.properties)
    for s in p.subscriptions:
        body += encode_str(s.filter)
        opts = s.qos
        if level == 5:
            opts |= (4 if s.no_local else 0) | (8 if s.retain_as_published else 0)
            opts |= s.retain_handling << 4
        body.append(opts)
    return _frame(0x82, bytes(body))


def _encode_suback(p: SubAck, level: int) -> bytes:
    body = p.packet_id.to_bytes(2, "big")
    if level == 5:
        body += encode_properties(p.properties)
    return _frame(0x90, body + bytes(p.reason_codes))


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    body = bytearray(p.packet_id.to_bytes(2, "big"))
    if level == 5:
        body += encode_properties(p.properties)
    for f in p.filters:
        body += encode_str(f)
    return _frame(0xA2, bytes(body))


def _encode_unsuback(p: UnsubAck, level: int) -> bytes:
    body = p.packet_id.to_bytes(2, "big")
    if level == 5:
        body += encode_properties(p.properties) + bytes(p.reason_codes)
    return _frame(0xB0, body)


def _encode_reason(first: int, p: Disconnect | Auth, level: int) -> bytes:
    if level < 5:
        return bytes((first, 0))
    if p.properties is EMPTY:
        if p.reason_code == 0:
            return bytes((first, 0))  # [MQTT-3.14.2.1] reason 0 without properties: omitted
        return bytes((first, 1, p.reason_code))
    return _frame(first, bytes((p.reason_code,)) + encode_properties(p.properties))


def encode(packet: Packet, level: int) -> bytes:
    """Serialize `packet` for a peer speaking protocol `level` (3, 4 or 5)."""
    if isinstance(packet, Publish):
        return encode_publish(packet, level)
    if isinstance(packet, PubAck):
        return _encode_ack(0x40, packet, level)
    if isinstance(packet, PubRec):
        return _encode_ack(0x50, packet, level)
    if isinstance(packet, PubRel):
        return _encode_ack(0x62, packet, level)
    if isinstance(packet, PubComp):
        return _encode_ack(0x70, packet, level)
    if isinstance(packet, PingReq):
        return b"\xc0\x00"
    if isinstance(packet, PingResp):
        return b"\xd0\x00"
    if isinstance(packet, Connect):
        return _encode_connect(packet, level)
    if isinstance(packet, ConnAck):
        return _encode_connack(packet, level)
    if isinstance(packet, Subscribe):
        return _encode_subscribe(packet, level)
    if isinstance(packet, SubAck):
        return _encode_suback(packet, level)
    if isinstance(packet, Unsubscribe):
        return _encode_unsubscribe(packet, level)
    if isinstance(packet, UnsubAck):
        return _encode_unsuback(packet, level)
    if isinstance(packet, Disconnect):
        return _encode_reason(0xE0, packet, level)
    if isinstance(packet, Auth):
        return _encode_reason(0xF0, packet, level)
    raise TypeError(f"not an MQTT packet: {packet!r}")
