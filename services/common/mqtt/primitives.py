"""Decoding and encoding primitives of spec section 1.5 (integers, strings, binary data).

Decoders take `(buf, pos, end)` and return `(value, new_pos)`; reading past `end` is a
malformed packet, because the decoder only calls them once the whole packet has arrived.
"""

from __future__ import annotations

from services.common.mqtt.errors import MalformedPacketError

MAX_VARINT = 268_435_455


def read_u8(b: bytes, i: int, end: int) -> tuple[int, int]:
    if i >= end:
        raise MalformedPacketError("packet ends inside a byte field")
    return b[i], i + 1


def read_u16(b: bytes, i: int, end: int) -> tuple[int, int]:
    if i + 2 > end:
        raise MalformedPacketError("packet ends inside a two byte integer")
    return (b[i] << 8) | b[i + 1], i + 2


def read_u32(b: bytes, i: int, end: int) -> tuple[int, int]:
    if i + 4 > end:
        raise MalformedPacketError("packet ends inside a four byte integer")
    return int.from_bytes(b[i : i + 4], "big"), i + 4


def read_varint(b: bytes, i: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for _ in range(4):
        if i >= end:
            raise MalformedPacketError("packet ends inside a variable byte integer")
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if not byte and shift:  # a last byte of 0 means a shorter encoding existed
                raise MalformedPacketError("variable byte integer not in its shortest form")
            return value, i
        shift += 7
    # [MQTT-1.5.5-1] at most four bytes, and the fewest that hold the value.
    raise MalformedPacketError("variable byte integer longer than four bytes")


def read_binary(b: bytes, i: int, end: int) -> tuple[bytes, int]:
    if i + 2 > end:
        raise MalformedPacketError("packet ends inside a length prefix")
    n = (b[i] << 8) | b[i + 1]
    j = i + 2 + n
    if j > end:
        raise MalformedPacketError("length prefix runs past the packet end")
    return bytes(b[i + 2 : j]), j


def check_utf8(raw: bytes) -> str:
    try:
        # Python's strict codec rejects ill-formed sequences and encoded surrogates
        # [MQTT-1.5.4-1].
        s = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacketError("string is not well-formed UTF-8") from exc
    if "\x00" in s:
        raise MalformedPacketError("string contains U+0000")  # [MQTT-1.5.4-2]
    return s


def is_utf8_payload(payload: bytes) -> bool:
    """A payload with Payload Format Indicator 1 must be well-formed UTF-8 [MQTT-3.3.2-4];
    unlike a UTF-8 Encoded String it may contain U+0000 (section 3.3.2.3.2)."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def read_str(b: bytes, i: int, end: int) -> tuple[str, int]:
    raw, j = read_binary(b, i, end)
    return check_utf8(raw), j


def encode_varint(n: int) -> bytes:
    if n < 128:
        return bytes((n,))
    if n > MAX_VARINT:
        raise ValueError(f"variable byte integer out of range: {n}")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return len(data).to_bytes(2, "big") + data


def encode_str(s: str) -> bytes:
    return encode_binary(s.encode("utf-8"))
