"""The load generator reads MQTT frames itself (bench/frames.py): it must see exactly the
packets the project's decoder sees, however TCP cuts the stream, and its pre-encoded QoS 1
packets must be what the encoder would have written."""

from __future__ import annotations

import random

from bench.frames import Qos1Frames, split_frames
from services.common.mqtt import (
    ConnAck,
    Decoder,
    PubAck,
    Publish,
    SubAck,
    encode,
    encode_publish,
)


def stream() -> tuple[bytes, list[object]]:
    packets: list[object] = [
        ConnAck(False, 0),
        SubAck(1, (1,)),
        Publish("a/b", b"x" * 64),
        Publish("a/b", b"y" * 100, 1, False, False, 7),
        PubAck(7),
        Publish("big", b"z" * 200),  # remaining length in two bytes
        Publish("huge", b"w" * 20_000, 1, False, False, 65535),  # in three bytes
        Publish("t", b""),
    ]
    raw = b"".join(
        encode_publish(p, 4) if isinstance(p, Publish) else encode(p, 4)  # type: ignore[arg-type]
        for p in packets
    )
    return raw, packets


def test_frames_match_the_decoder_for_every_cut_of_the_stream() -> None:
    raw, packets = stream()
    expected = Decoder(4).feed(raw)
    assert len(expected) == len(packets)
    rnd = random.Random(1)
    for _ in range(300):
        buf = bytearray()
        frames: list[bytes] = []
        i = 0
        while i < len(raw):
            step = rnd.choice((1, 2, 3, 7, 100, 5000))
            buf += raw[i : i + step]
            i += step
            found, used = split_frames(buf)
            begin = 0  # frames are back to back from the buffer's start
            for _, _, end in found:
                frames.append(bytes(buf[begin:end]))
                begin = end
            del buf[:used]
        assert not buf
        assert Decoder(4).feed(b"".join(frames)) == expected
        assert len(frames) == len(packets)


def test_first_byte_says_type_and_qos() -> None:
    raw, _ = stream()
    found, used = split_frames(raw)
    assert used == len(raw)
    assert [(first >> 4, (first >> 1) & 3) for first, _, _ in found] == [
        (2, 0),
        (9, 0),
        (3, 0),
        (3, 1),
        (4, 0),
        (3, 0),
        (3, 1),
        (3, 0),
    ]


def test_an_incomplete_packet_is_left_for_later() -> None:
    raw = encode_publish(Publish("a", b"x" * 300), 4)
    for cut in range(len(raw)):
        assert split_frames(raw[:cut]) == ([], 0)


def test_qos1_frames_are_the_encoders_packets_with_ids_that_wrap() -> None:
    frames = Qos1Frames("b/t/3", b"p" * 64)
    first = frames.take(3)
    assert first == b"".join(
        encode_publish(Publish("b/t/3", b"p" * 64, 1, False, False, i), 4) for i in (1, 2, 3)
    )
    frames.pid = 65534
    ids = [p.packet_id for p in Decoder(4).feed(frames.take(3))]  # type: ignore[attr-defined]
    assert ids == [65535, 1, 2]
