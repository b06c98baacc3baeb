"""The golden table through the decoder (and, for valid packets, back through the encoder)."""

from __future__ import annotations

import pytest

from services.common.mqtt import Decoder, MqttError, PacketTooLargeError, encode
from tests.common.golden import GOLDEN, WILL_CONNECT, Golden


@pytest.mark.parametrize("g", GOLDEN, ids=[g.id for g in GOLDEN])
def test_golden_packet(g: Golden) -> None:
    dec = Decoder(g.level)
    if isinstance(g.expect, int):
        with pytest.raises(MqttError) as info:
            dec.feed(g.raw)
        assert info.value.reason_code == g.expect, str(info.value)
    else:
        assert dec.feed(g.raw) == [g.expect]
        assert encode(g.expect, g.level) == g.raw


def test_will_connect_round_trip_byte_by_byte() -> None:
    raw = encode(WILL_CONNECT, 5)
    dec = Decoder(4)
    got = []
    for i in range(len(raw)):
        got += dec.feed(raw[i : i + 1])
    assert got == [WILL_CONNECT]
    assert dec.protocol_level == 5  # later packets are read as MQTT 5


def test_packet_too_large_rejected_before_body_arrives() -> None:
    dec = Decoder(4, max_packet_size=100)
    # Only the fixed header of a 1 MB PUBLISH: rejected without waiting for the body.
    with pytest.raises(MqttError) as info:
        dec.feed(bytes([0x30, 0x80, 0x80, 0x40]))
    assert isinstance(info.value.cause, PacketTooLargeError)
    assert info.value.reason_code == 0x95


def test_packets_before_an_error_are_returned_with_it() -> None:
    good = bytes.fromhex("c000")
    bad = bytes.fromhex("c100")
    with pytest.raises(MqttError) as info:
        Decoder(4).feed(good + good + bad)
    assert len(info.value.packets) == 2
