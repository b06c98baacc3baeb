"""The load generator's wire bytes, without asyncio: `split_frames` finds the MQTT packets in
what a socket delivered, and `Qos1Frames` writes QoS 1 PUBLISH packets from one encoding.

Both exist so the generator stays cheaper than the brokers it measures: it reads only the
fields it needs from each frame, and encodes a publisher's packets once."""

from __future__ import annotations

from services.common.mqtt import Publish, encode_publish


def split_frames(buf: bytes | bytearray) -> tuple[list[tuple[int, int, int]], int]:
    """The complete MQTT packets at the start of `buf`: (first byte, body start, body end)
    each, and how many bytes they take. What follows is an incomplete packet.

    The generator reads only what it needs (type, QoS, packet id, payload) from the frames
    instead of decoding whole packets: full decoding made it the bottleneck on two cores.
    The brokers under test are trusted; a malformed length would only stall this client.
    """
    frames: list[tuple[int, int, int]] = []
    i, n = 0, len(buf)
    while i + 2 <= n:
        j = i + 1
        size = buf[j] & 0x7F
        if buf[j] & 0x80:
            shift = 7
            while True:
                j += 1
                if j >= n:
                    return frames, i
                size |= (buf[j] & 0x7F) << shift
                if not buf[j] & 0x80:
                    break
                shift += 7
        end = j + 1 + size
        if end > n:
            break
        frames.append((buf[i], j + 1, end))
        i = end
    return frames, i


class Qos1Frames:
    """QoS 1 PUBLISH packets of one topic and payload, told apart only by their packet id:
    encoded once, the id spliced in per message (the generator must stay cheaper than a
    broker)."""

    def __init__(self, topic: str, payload: bytes) -> None:
        frame = encode_publish(Publish(topic, payload, 1, False, False, 1), 4)
        cut = len(frame) - len(payload) - 2  # 3.1.1: the packet id right before the payload
        self.head, self.tail = frame[:cut], frame[cut + 2 :]
        self.pid = 0

    def take(self, count: int) -> bytes:
        parts = []
        for _ in range(count):
            self.pid = self.pid % 65535 + 1
            parts.append(self.head + self.pid.to_bytes(2, "big") + self.tail)
        return b"".join(parts)
