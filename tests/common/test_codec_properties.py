"""Property tests of the codec: round trip, prefixes, hostile bytes and chunking."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.mqtt import Connect, Decoder, MqttError, encode
from tests.common.strategies import packets

LEVELS = [3, 4, 5]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decoder_for(packet: Any, level: int) -> Decoder:
    # A CONNECT announces its own level; everything else is read at the session's level.
    return Decoder(4 if isinstance(packet, Connect) else level)


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.data())
def test_encode_then_decode_is_identity(level: int, data: st.DataObject) -> None:
    packet = data.draw(packets(level))
    raw = encode(packet, level)
    assert _decoder_for(packet, level).feed(raw) == [packet]


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.data())
def test_every_prefix_yields_no_packet(level: int, data: st.DataObject) -> None:
    packet = data.draw(packets(level))
    raw = encode(packet, level)
    for i in range(len(raw)):
        assert _decoder_for(packet, level).feed(raw[:i]) == []


@pytest.mark.parametrize("level", LEVELS)
@FAST
@given(data=st.data())
def test_any_chunking_yields_the_same_packets(level: int, data: st.DataObject) -> None:
    pkts = data.draw(st.lists(packets(level), min_size=1, max_size=5))
    pkts = [p for p in pkts if not isinstance(p, Connect)]
    raw = b"".join(encode(p, level) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    dec = Decoder(level)
    got: list[Any] = []
    prev = 0
    for cut in [*cuts, len(raw)]:
        got += dec.feed(raw[prev:cut])
        prev = cut
    assert got == pkts


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=500, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=6))
def test_random_bytes_raise_only_mqtt_errors(level: int, chunks: list[bytes]) -> None:
    dec = Decoder(level, max_packet_size=4096)
    for chunk in chunks:
        try:
            dec.feed(chunk)
        except MqttError:
            return
