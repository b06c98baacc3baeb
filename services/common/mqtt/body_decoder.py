"""Decoding of packet bodies, one function per packet type (property blocks:
property_decoder.py, whose `DecodeLimits` this module re-exports).

Theory of operation: the framing layer (`decoder.Decoder`) has already checked the fixed-header
flags and cut out exactly one body, so every function here sees `(flags, body, level)` and must
consume the whole body; any leftover or shortfall is a malformed packet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.common.mqtt.errors import (
    MalformedPacketError,
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
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.primitives import (
    check_utf8,
    read_binary,
    read_str,
    read_u8,
    read_u16,
)
from services.common.mqtt.properties import EMPTY, WILL
from services.common.mqtt.property_decoder import UNLIMITED, DecodeLimits, decode_properties
from services.common.mqtt.reason import V5_FROM_V3_CONNACK, PacketType

__all__ = ["UNLIMITED", "DecodeLimits", "decode_properties"]  # and the decode_* functions

_VALID_REASONS: dict[int, frozenset[int]] = {
    PacketType.PUBACK: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREC: frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99}),
    PacketType.PUBREL: frozenset({0x00, 0x92}),
    PacketType.PUBCOMP: frozenset({0x00, 0x92}),
    PacketType.AUTH: frozenset({0x00, 0x18, 0x19}),
}


def _done(i: int, end: int) -> None:
    if i != end:
        raise MalformedPacketError("packet has bytes after its last field")


def _read_protocol(b: bytes, end: int) -> tuple[str, int, int]:
    """Read CONNECT's protocol name and level: (name, level, offset after them)."""
    name, i = read_str(b, 0, end)
    lvl, i = read_u8(b, i, end)
    if not ((name == "MQTT" and lvl in (4, 5)) or (name == "MQIsdp" and lvl == 3)):
        # [MQTT-3.1.2-2] unsupported level: answer CONNACK 0x84 / return code 1, then close.
        raise UnsupportedProtocolVersionError(f"unsupported protocol {name!r} level {lvl}")
    return name, lvl, i


def _read_will(
    b: bytes, i: int, end: int, lvl: int, will_qos: int, will_retain: bool, limits: DecodeLimits
) -> tuple[Will, int]:
    """Read the will (properties on 5, topic, payload) of a CONNECT with the will flag set."""
    wprops = EMPTY
    if lvl == 5:
        wprops, i = decode_properties(b, i, end, WILL, limits)
    wtopic, i = read_str(b, i, end)
    wpayload, i = read_binary(b, i, end)
    return Will(wtopic, wpayload, will_qos, will_retain, wprops), i


def decode_connect(flags: int, b: bytes, level: int, limits: DecodeLimits) -> Connect:
    end = len(b)
    name, lvl, i = _read_protocol(b, end)
    cflags, i = read_u8(b, i, end)
    if cflags & 0x01:
        raise MalformedPacketError("CONNECT reserved flag is set")  # [MQTT-3.1.2-3]
    will_flag = bool(cflags & 0x04)
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    has_password = bool(cflags & 0x40)
    has_username = bool(cflags & 0x80)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacketError("will QoS/retain set without will flag")  # [MQTT-3.1.2-11]
    if will_qos == 3:
        raise MalformedPacketError("will QoS 3")  # [MQTT-3.1.2-12]
    if lvl < 5 and has_password and not has_username:
        raise MalformedPacketError("password without user name")  # [MQTT-3.1.2-22]
    keepalive, i = read_u16(b, i, end)
    props = EMPTY
    if lvl == 5:
        props, i = decode_properties(b, i, end, PacketType.CONNECT, limits)
    client_id, i = read_str(b, i, end)
    will = None
    if will_flag:
        will, i = _read_will(b, i, end, lvl, will_qos, will_retain, limits)
    username = password = None
    if has_username:
        username, i = read_str(b, i, end)
    if has_password:
        password, i = read_binary(b, i, end)
    _done(i, end)
    return Connect(
        client_id=client_id,
        protocol_level=lvl,
        protocol_name=name,
        clean_start=bool(cflags & 0x02),
        keepalive_s=keepalive,
        username=username,
        password=password,
        will=will,
        properties=props,
    )


def decode_connack(flags: int, b: bytes, level: int, limits: DecodeLimits) -> ConnAck:
    end = len(b)
    ack_flags, i = read_u8(b, 0, end)
    if ack_flags & 0xFE:
        raise MalformedPacketError("CONNACK reserved flags set")  # [MQTT-3.2.2-1]
    code, i = read_u8(b, i, end)
    props = EMPTY
    if level == 5:
        props, i = decode_properties(b, i, end, PacketType.CONNACK, limits)
    else:
        code = V5_FROM_V3_CONNACK.get(code, code)
    _done(i, end)
    return ConnAck(bool(ack_flags & 1), code, props)


def decode_publish(flags: int, b: bytes, level: int, limits: DecodeLimits) -> Publish:
    end = len(b)
    qos = (flags >> 1) & 0x03
    n = (b[0] << 8) | b[1] if end >= 2 else -1
    if n < 0 or 2 + n > end:
        raise MalformedPacketError("PUBLISH topic runs past the packet end")
    i = 2 + n
    topic = check_utf8(b[2:i])
    packet_id = None
    if qos:
        if i + 2 > end:
            raise MalformedPacketError("PUBLISH ends inside the packet identifier")
        packet_id = (b[i] << 8) | b[i + 1]
        i += 2
        if packet_id == 0:
            raise MalformedPacketError("packet identifier 0")  # [MQTT-2.2.1-3]
    props = EMPTY
    if level == 5:
        if i < end and b[i] == 0:
            i += 1
        else:
            props, i = decode_properties(b, i, end, PacketType.PUBLISH, limits)
    return Publish(topic, b[i:], qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def _ack_decoder(cls: type[PubAck | PubRec | PubRel | PubComp], ptype: int) -> Any:
    valid = _VALID_REASONS[ptype]

    def decode(
        flags: int, b: bytes, level: int, limits: DecodeLimits
    ) -> PubAck | PubRec | PubRel | PubComp:
        end = len(b)
        pid, i = read_u16(b, 0, end)
        if pid == 0:
            raise MalformedPacketError("packet identifier 0")  # [MQTT-2.2.1-3]
        code = 0
        props = EMPTY
        if level == 5 and i < end:
            code, i = read_u8(b, i, end)
            if code not in valid:
                raise MalformedPacketError(f"invalid reason code 0x{code:02x}")
            if i < end:
                props, i = decode_properties(b, i, end, ptype, limits)
        _done(i, end)
        return cls(pid, code, props)

    return decode


def decode_subscribe(flags: int, b: bytes, level: int, limits: DecodeLimits) -> Subscribe:
    end = len(b)
    pid, i = read_u16(b, 0, end)
    if pid == 0:
        raise MalformedPacketError("packet identifier 0")  # [MQTT-2.2.1-3]
    props = EMPTY
    if level == 5:
        props, i = decode_properties(b, i, end, PacketType.SUBSCRIBE, limits)
    subs: list[Subscription] = []
    max_filters = limits.max_topic_filters
    while i < end:
        if len(subs) >= max_filters:
            # Stop reading here: the rest of a flood would cost time for nothing.
            raise QuotaExceededError(
                f"more than {max_filters} topic filters in one SUBSCRIBE",
                limit="max_topic_filters",
            )
        filt, i = read_str(b, i, end)
        opts, i = read_u8(b, i, end)
        qos = opts & 0x03
        if qos == 3:
            raise MalformedPacketError("subscription QoS 3")  # [MQTT-3.8.3-4]
        if level == 5:
            if opts & 0xC0:
                raise MalformedPacketError("subscription options reserved bits set")  # 3.8.3-5
            rh = (opts >> 4) & 0x03
            if rh == 3:
                raise ProtocolViolationError("retain handling 3")
            subs.append(Subscription(filt, qos, bool(opts & 4), bool(opts & 8), rh))
        else:
            if opts & 0xFC:
                raise MalformedPacketError("requested QoS reserved bits set")  # [MQTT-3-8.3-4]
            subs.append(Subscription(filt, qos))
    if not subs:
        raise ProtocolViolationError("SUBSCRIBE without topic filters")  # [MQTT-3.8.3-3]
    return Subscribe(pid, tuple(subs), props)


def decode_suback(flags: int, b: bytes, level: int, limits: DecodeLimits) -> SubAck:
    end = len(b)
    pid, i = read_u16(b, 0, end)
    props = EMPTY
    if level == 5:
        props, i = decode_properties(b, i, end, PacketType.SUBACK, limits)
    return SubAck(pid, tuple(b[i:end]), props)


def decode_unsubscribe(flags: int, b: bytes, level: int, limits: DecodeLimits) -> Unsubscribe:
    end = len(b)
    pid, i = read_u16(b, 0, end)
    if pid == 0:
        raise MalformedPacketError("packet identifier 0")  # [MQTT-2.2.1-3]
    props = EMPTY
    if level == 5:
        props, i = decode_properties(b, i, end, PacketType.UNSUBSCRIBE, limits)
    filters: list[str] = []
    max_filters = limits.max_topic_filters
    while i < end:
        if len(filters) >= max_filters:
            raise QuotaExceededError(
                f"more than {max_filters} topic filters in one UNSUBSCRIBE",
                limit="max_topic_filters",
            )
        f, i = read_str(b, i, end)
        filters.append(f)
    if not filters:
        raise ProtocolViolationError("UNSUBSCRIBE without topic filters")  # [MQTT-3.10.3-2]
    return Unsubscribe(pid, tuple(filters), props)


def decode_unsuback(flags: int, b: bytes, level: int, limits: DecodeLimits) -> UnsubAck:
    end = len(b)
    pid, i = read_u16(b, 0, end)
    if level < 5:
        _done(i, end)
        return UnsubAck(pid)
    props, i = decode_properties(b, i, end, PacketType.UNSUBACK, limits)
    return UnsubAck(pid, tuple(b[i:end]), props)


def _empty_decoder(cls: type[PingReq | PingResp]) -> Any:
    def decode(flags: int, b: bytes, level: int, limits: DecodeLimits) -> PingReq | PingResp:
        if b:
            raise MalformedPacketError(f"{cls.__name__} has a body")
        return cls()

    return decode


def _reason_decoder(cls: type[Disconnect | Auth], ptype: int) -> Any:
    def decode(flags: int, b: bytes, level: int, limits: DecodeLimits) -> Disconnect | Auth:
        end = len(b)
        if level < 5:
            if ptype == PacketType.AUTH:
                raise MalformedPacketError("AUTH exists only in MQTT 5")
            _done(0, end)
            return cls()
        if end == 0:
            return cls()
        code, i = read_u8(b, 0, end)
        valid = _VALID_REASONS.get(ptype)
        if valid is not None and code not in valid:
            raise MalformedPacketError(f"invalid reason code 0x{code:02x}")
        props = EMPTY
        if i < end:
            props, i = decode_properties(b, i, end, ptype, limits)
        _done(i, end)
        return cls(code, props)

    return decode


BodyDecoder = Callable[[int, bytes, int, DecodeLimits], Packet]

BODY_DECODERS: dict[int, BodyDecoder] = {
    PacketType.CONNECT: decode_connect,
    PacketType.CONNACK: decode_connack,
    PacketType.PUBLISH: decode_publish,
    PacketType.PUBACK: _ack_decoder(PubAck, PacketType.PUBACK),
    PacketType.PUBREC: _ack_decoder(PubRec, PacketType.PUBREC),
    PacketType.PUBREL: _ack_decoder(PubRel, PacketType.PUBREL),
    PacketType.PUBCOMP: _ack_decoder(PubComp, PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: decode_subscribe,
    PacketType.SUBACK: decode_suback,
    PacketType.UNSUBSCRIBE: decode_unsubscribe,
    PacketType.UNSUBACK: decode_unsuback,
    PacketType.PINGREQ: _empty_decoder(PingReq),
    PacketType.PINGRESP: _empty_decoder(PingResp),
    PacketType.DISCONNECT: _reason_decoder(Disconnect, PacketType.DISCONNECT),
    PacketType.AUTH: _reason_decoder(Auth, PacketType.AUTH),
}
