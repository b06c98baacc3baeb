"""Incremental MQTT decoder: feed byte chunks of any size, get complete packets.

Invariants:
- `_buf` only ever holds the bytes of packets not yet returned (a partial packet at most,
  after `feed` returns).
- The maximum packet size is checked as soon as the fixed header is complete, before the body
  is buffered [MQTT-3.1.2-24] / 0x95, so a hostile peer cannot make us hold a huge body. The
  owner may change `max_packet_size` between calls (a connection allows less before CONNACK).
- Count limits (`DecodeLimits`: user properties, filters per packet) stop a body's decoding
  as soon as they are exceeded: the work per packet is linear in its size and bounded.
- A CONNECT that is refused (too large, over a limit) still tells its protocol level when
  its first bytes say MQTT 5: `protocol_level` is then 5, so the caller may answer with a
  CONNACK carrying the reason code [MQTT-4.13.1-1].
- Any violation raises an `MqttError`; the packets decoded before it in the same call ride on
  the error (`packets`), so the caller can still act on them before closing.
"""

from __future__ import annotations

from typing import Final

from services.common.mqtt.body_decoder import (
    BODY_DECODERS,
    UNLIMITED,
    DecodeLimits,
    decode_publish,
)
from services.common.mqtt.errors import MalformedPacketError, MqttError, PacketTooLargeError
from services.common.mqtt.packets import Packet, PubAck
from services.common.mqtt.reason import ReasonCode

# The whole packet, fixed header included, may not exceed this by default (1 MiB).
DEFAULT_MAX_PACKET_SIZE = 1 << 20
# Largest packet the protocol can express: 1 byte type + 4 byte length + 268,435,455.
PROTOCOL_MAX_PACKET_SIZE = 268_435_460

# Required low nibble of the fixed header per packet type [MQTT-2.1.3-1]; PUBLISH is special.
_FIXED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0}
_FIXED_FLAGS |= {14: 0, 15: 0}
# Plain PUBACKs (success, no properties) by packet id: packets are immutable, so one object
# per id serves every connection (at most 65,535 of them).
_PUBACKS: Final[dict[int, PubAck]] = {}


def plain_puback(pid: int) -> PubAck:
    """PUBACK `pid` with no reason code or properties (MalformedPacketError for id 0)."""
    ack = _PUBACKS.get(pid)
    if ack is None:
        if not pid:
            raise MalformedPacketError("packet identifier 0")  # [MQTT-2.2.1-3]
        ack = _PUBACKS[pid] = PubAck(pid)
    return ack


def _remaining_length(view: bytes | bytearray, i: int, n: int) -> tuple[int, int]:
    """The remaining length whose first byte is `view[i]`, and the offset after it; (0, -1)
    when its bytes are not all there yet (`n`: the end of what arrived)."""
    rl = 0
    shift = 0
    while True:  # up to four bytes [MQTT-1.5.5-1]
        if i >= n:
            return 0, -1
        byte = view[i]
        i += 1
        rl |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if not byte and shift:  # [MQTT-1.5.5-1] the fewest bytes: no 0x80 0x00
                raise MalformedPacketError("remaining length not in its shortest form")
            return rl, i
        shift += 7
        if shift > 21:
            raise MalformedPacketError("remaining length longer than four bytes")


class DecodeError(MqttError):
    """Wraps the first error of a `feed` call together with the packets decoded before it."""


class Decoder:
    """Stateful framing over a byte stream. Set `protocol_level` once CONNECT is known."""

    __slots__ = ("_buf", "limits", "max_packet_size", "protocol_level")

    def __init__(
        self,
        protocol_level: int = 4,
        max_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
        limits: DecodeLimits = UNLIMITED,
    ) -> None:
        self._buf = bytearray()
        self.protocol_level = protocol_level
        self.max_packet_size = max_packet_size
        self.limits = limits

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Packet]:
        """Append `data`, return every packet now complete, in order."""
        buf = self._buf
        # With nothing buffered, decode straight from `data`: no copy on the common path.
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data
        out: list[Packet] = []
        try:
            pos = self._decode_complete_packets(view, out)
        except MqttError as exc:
            raise self._failed(out, str(exc), exc.reason_code, exc) from exc
        except (IndexError, ValueError) as exc:  # defensive: never leak a non-MQTT error
            reason = MalformedPacketError.reason_code
            raise self._failed(out, f"malformed packet: {exc}", reason, exc) from exc
        # Keep only the start of a packet not complete yet.
        if buf:
            del buf[:pos]
        elif pos < len(view):
            self._buf = bytearray(view[pos:])
        return out

    def _decode_complete_packets(self, view: bytes | bytearray, out: list[Packet]) -> int:
        """Decode every complete packet at the start of `view` into `out`; return the offset
        of the first byte not consumed (a partial packet at most).

        This loop is the decoder's hot path: a remaining length of one or two bytes (a body
        under 16 KiB) and PUBLISH are handled inline rather than in helpers, because a Python
        call per packet costs measurably; `_remaining_length` reads the longer ones.
        """
        pos = 0
        n = len(view)
        max_size = self.max_packet_size
        limits = self.limits
        while n - pos >= 2:
            first = view[pos]
            rl = view[pos + 1]
            i = pos + 2
            if rl & 0x80:  # the remaining length goes on in the next bytes
                if n - pos > 2 and 0 < view[pos + 2] < 0x80:  # two bytes: a body under 16 KiB
                    rl, i = (rl & 0x7F) | (view[pos + 2] << 7), pos + 3
                else:
                    rl, i = _remaining_length(view, pos + 1, n)
                    if i < 0:
                        return pos  # the remaining length itself is not complete yet
            # Checked before waiting for the body, so an oversize body is never buffered.
            end = i + rl
            if end - pos > max_size:
                raise self._too_large(view, first, i, end - pos)
            if end > n:
                return pos  # the body is not complete yet
            if first == 0x40 and rl == 2:  # a plain PUBACK, the usual packet after PUBLISH
                pos = end
                out.append(plain_puback((view[i] << 8) | view[i + 1]))
                continue
            ptype = first >> 4
            flags = first & 0x0F
            body = bytes(view[i:end])
            pos = end
            if ptype == 3:  # PUBLISH
                qos = (flags >> 1) & 3
                if qos == 3:
                    raise MalformedPacketError("PUBLISH with QoS 3")  # [MQTT-3.3.1-4]
                if qos == 0 and flags & 8:
                    raise MalformedPacketError("DUP set on QoS 0")  # [MQTT-3.3.1-2]
                out.append(decode_publish(flags, body, self.protocol_level, limits))
            else:
                out.append(self._decode_control_packet(ptype, flags, body))
        return pos

    def _too_large(
        self, view: bytes | bytearray, first: int, i: int, total: int
    ) -> PacketTooLargeError:
        """The error for a packet of `total` bytes, over the maximum packet size, whose body
        starts at `view[i]`; a CONNECT's first bytes still tell its protocol level."""
        if first >> 4 == 1:
            self._note_connect_level(view, i, len(view))
        return PacketTooLargeError(
            f"packet of {total} bytes exceeds {self.max_packet_size}", limit="max_packet_size"
        )

    def _decode_control_packet(self, ptype: int, flags: int, body: bytes) -> Packet:
        """Decode a packet other than PUBLISH, whose fixed header flags are fixed values."""
        expected = _FIXED_FLAGS.get(ptype)
        if expected is None:
            raise MalformedPacketError("reserved packet type 0")
        if flags != expected:
            raise MalformedPacketError(  # [MQTT-2.1.3-1]
                f"invalid fixed header flags {flags:#x} for packet type {ptype}"
            )
        if ptype != 1:
            return BODY_DECODERS[ptype](flags, body, self.protocol_level, self.limits)
        try:
            packet = BODY_DECODERS[1](flags, body, self.protocol_level, self.limits)
        except MqttError:
            self._note_connect_level(body, 0, len(body))
            raise
        # Everything after CONNECT is read at the level it announced.
        self.protocol_level = packet.protocol_level  # type: ignore[union-attr]
        return packet

    def _note_connect_level(self, b: bytes | bytearray, i: int, end: int) -> None:
        """A CONNECT body starting at `b[i]` is refused: if what arrived of it says MQTT 5,
        remember that, so the caller can answer in MQTT 5 (a CONNACK with the reason)."""
        if end - i < 7:  # name length (2), "MQTT" (4), level (1)
            return
        if b[i : i + 6] == b"\x00\x04MQTT" and b[i + 6] == 5:
            self.protocol_level = 5

    def _failed(
        self, out: list[Packet], message: str, reason_code: ReasonCode, cause: Exception
    ) -> DecodeError:
        """Drop the buffer (the stream is unusable after a violation) and build the error that
        carries the packets decoded before it."""
        self._buf = bytearray()
        err = DecodeError(message, reason_code, getattr(cause, "limit", ""))
        err.packets = out
        err.cause = cause
        return err
