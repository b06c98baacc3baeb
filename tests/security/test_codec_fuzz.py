"""The codec under hostile input: mutated and random packets only ever raise `MqttError`
from `Decoder.feed`, count limits stop decoding early, and decoding time grows linearly with
the packet (a flood of 8N properties or filters costs about 8 times N, not 64 times).

The timing checks compare two sizes of the same work in this process, best of a few runs,
with a generous bound (24x for 8x the input), so a loaded machine does not fail them while a
quadratic path (64x and more) does. An optional atheris harness lives in atheris_codec.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.mqtt import (
    UNLIMITED,
    Connect,
    DecodeLimits,
    Decoder,
    MqttError,
    PacketTooLargeError,
    Properties,
    Publish,
    QuotaExceededError,
    Subscribe,
    Subscription,
    Unsubscribe,
    encode,
)
from services.common.mqtt.packets import Packet
from tests.common.strategies import connect, packets

# What a connection node decodes with (small, so hypothesis reaches the limits).
SERVER_LIMITS = DecodeLimits(max_user_properties=8, max_topic_filters=8)
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
GROWTH = 8  # the bigger input is this many times the smaller one
MAX_RATIO = 24.0  # linear: about 8; quadratic: 64 and more


def _feed_all(dec: Decoder, chunks: list[bytes]) -> list[Packet]:
    """Feed every chunk; stop at the first error, which must be an MqttError."""
    out: list[Packet] = []
    for chunk in chunks:
        try:
            out += dec.feed(chunk)
        except MqttError:
            return out
    return out


def _mutate(data: bytearray, ops: list[tuple[int, int, bytes]]) -> bytes:
    """Apply (kind, position, bytes) edits: overwrite, insert, delete, truncate."""
    for kind, pos, blob in ops:
        if not data:
            break
        pos %= len(data)
        if kind == 0:
            data[pos : pos + len(blob)] = blob
        elif kind == 1:
            data[pos:pos] = blob
        elif kind == 2:
            del data[pos : pos + 1 + len(blob)]
        else:
            del data[pos:]
    return bytes(data)


_edits = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8)),
    min_size=1,
    max_size=6,
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [3, 4, 5])
@FUZZ
@given(data=st.data())
def test_mutated_streams_raise_only_mqtt_errors(level: int, data: st.DataObject) -> None:
    """A CONNECT and what follows, mutated and cut anywhere: packets or an MqttError."""
    first = data.draw(connect(level))
    rest = data.draw(st.lists(packets(level), max_size=4))
    raw = bytearray(encode(first, level) + b"".join(encode(p, level) for p in rest))
    mutated = _mutate(raw, data.draw(_edits))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(mutated)), max_size=6)))
    chunks = [mutated[a:b] for a, b in zip([0, *cuts], [*cuts, len(mutated)], strict=True)]
    got = _feed_all(Decoder(4, 4096, SERVER_LIMITS), chunks)
    assert all(isinstance(p, get_args(Packet)) for p in got)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [4, 5])
@FUZZ
@given(
    first=st.integers(0, 255),
    body=st.binary(max_size=600),
    tail=st.lists(st.binary(max_size=32), max_size=3),
)
def test_framed_garbage_reaches_every_body_decoder(
    level: int, first: int, body: bytes, tail: list[bytes]
) -> None:
    """A valid fixed header of any type and flags around a random body: the body decoders
    see hostile bytes directly (random bytes rarely frame a packet)."""
    n = len(body)
    length = bytes([n]) if n < 128 else bytes([(n & 0x7F) | 0x80, n >> 7])
    dec = Decoder(level, 4096, SERVER_LIMITS)
    _feed_all(dec, [bytes([first]) + length + body, *tail])


@pytest.mark.timeout(120)
@FUZZ
@given(chunks=st.lists(st.binary(max_size=256), max_size=8), level=st.sampled_from([3, 4, 5]))
def test_random_bytes_raise_only_mqtt_errors(chunks: list[bytes], level: int) -> None:
    _feed_all(Decoder(level, 1024, SERVER_LIMITS), chunks)


# ---- limits stop decoding early -----------------------------------------------------------


def _user_props(n: int) -> Properties:
    return Properties(user_property=tuple(("k", "v") for _ in range(n)))


def test_a_packet_over_the_size_limit_is_refused_from_its_fixed_header() -> None:
    dec = Decoder(4, 1024, SERVER_LIMITS)
    header = b"\x30\xff\xff\x7f"  # PUBLISH of 2 MiB: nothing of the body has arrived
    with pytest.raises(MqttError) as info:
        dec.feed(header)
    assert isinstance(info.value.cause, PacketTooLargeError)
    assert dec.buffered == 0


@pytest.mark.parametrize(
    "packet",
    [
        Connect("c", 5, properties=_user_props(9)),
        Publish("t", b"", properties=_user_props(9)),
        Publish("t", b"", properties=Properties(subscription_identifier=tuple(range(1, 10)))),
        Subscribe(1, tuple(Subscription(f"f{i}", 0) for i in range(9))),
        Unsubscribe(1, tuple(f"f{i}" for i in range(9))),
    ],
)
def test_count_limits_raise_quota_exceeded(packet: Packet) -> None:
    dec = Decoder(5, 1 << 20, SERVER_LIMITS)
    with pytest.raises(MqttError) as info:
        dec.feed(encode(packet, 5))
    assert isinstance(info.value.cause, QuotaExceededError)
    assert info.value.reason_code == 0x97
    # One fewer is fine.
    smaller: dict[type, Packet] = {
        Connect: Connect("c", 5, properties=_user_props(8)),
        Publish: Publish("t", b"", properties=_user_props(8)),
        Subscribe: Subscribe(1, tuple(Subscription(f"f{i}", 0) for i in range(8))),
        Unsubscribe: Unsubscribe(1, tuple(f"f{i}" for i in range(8))),
    }
    assert len(Decoder(5, 1 << 20, SERVER_LIMITS).feed(encode(smaller[type(packet)], 5))) == 1


def test_a_subscribe_may_carry_one_subscription_identifier_only() -> None:
    raw = bytearray(
        encode(Subscribe(1, (Subscription("a", 0),), Properties(subscription_identifier=(7,))), 5)
    )
    # Duplicate the identifier property (0x0b 0x07): [MQTT-3.8.2.1.2].
    at = raw.index(b"\x0b\x07")
    raw[at:at] = b"\x0b\x07"
    raw[1] += 2
    raw[4] += 2  # property length
    with pytest.raises(MqttError) as info:
        Decoder(5).feed(bytes(raw))
    assert info.value.reason_code == 0x82


# ---- linear time ------------------------------------------------------------------------------


def _best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    # CPU time of this process, best of a few: other load on the machine (a whole suite, or
    # other work beside it) stretches wall time, and a ratio of wall times made this flaky.
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _ratio(make: Callable[[int], Callable[[], object]], n: int) -> float:
    small, big = make(n), make(GROWTH * n)
    small()  # warm up
    return _best_time(big) / _best_time(small)


def _decode(raw: bytes, level: int = 5, limits: DecodeLimits = UNLIMITED) -> Callable[[], object]:
    return lambda: Decoder(level, 1 << 28, limits).feed(raw)


def _refuse(raw: bytes) -> Callable[[], object]:
    def run() -> None:
        with pytest.raises(MqttError):
            Decoder(5, 1 << 28, SERVER_LIMITS).feed(raw)

    return run


FLOODS: dict[str, Callable[[int], Callable[[], object]]] = {
    "connect user properties": lambda n: _decode(
        encode(Connect("c", 5, properties=_user_props(n)), 5), 4
    ),
    "publish user properties": lambda n: _decode(
        encode(Publish("t", b"", properties=_user_props(n)), 5)
    ),
    "publish subscription identifiers": lambda n: _decode(
        encode(Publish("t", b"", properties=Properties(subscription_identifier=(5,) * n)), 5)
    ),
    "subscribe filters": lambda n: _decode(encode(Subscribe(1, (Subscription("a/b", 1),) * n), 5)),
    "unsubscribe filters": lambda n: _decode(encode(Unsubscribe(1, ("a/b",) * n), 5)),
    "many packets in one chunk": lambda n: _decode(encode(Publish("t", b"x"), 5) * n),
}


@pytest.mark.parametrize("flood", list(FLOODS))
def test_decoding_time_is_linear(flood: str) -> None:
    ratio = _ratio(FLOODS[flood], 2000)
    assert ratio < MAX_RATIO, f"{flood}: {GROWTH}x the input took {ratio:.1f}x the time"


def test_a_packet_fed_one_byte_at_a_time_is_linear() -> None:
    def make(n: int) -> Callable[[], object]:
        raw = encode(Publish("t", b"x" * n), 5)

        def run() -> None:
            dec = Decoder(5, 1 << 28)
            for i in range(len(raw)):
                dec.feed(raw[i : i + 1])

        return run

    ratio = _ratio(make, 4000)
    assert ratio < MAX_RATIO, f"{GROWTH}x the bytes took {ratio:.1f}x the time"


@pytest.mark.parametrize("flood", ["connect user properties", "subscribe filters"])
def test_refusing_a_flood_costs_less_than_decoding_a_small_one(flood: str) -> None:
    """Over a count limit decoding stops there: refusing 8N costs less than reading N
    (what is left is copying bytes, not building objects)."""
    n = 20000
    packet: Packet = {  # type: ignore[assignment]  # the dict's value type is their join
        "connect user properties": Connect("c", 5, properties=_user_props(GROWTH * n)),
        "subscribe filters": Subscribe(1, (Subscription("a/b", 1),) * (GROWTH * n)),
    }[flood]
    refuse = _best_time(_refuse(encode(packet, 5)))
    decode = _best_time(FLOODS[flood](n))
    assert refuse < decode / 4, f"refusing took {refuse * 1e3:.2f} ms, decoding {decode * 1e3:.2f}"


# ---- atheris ----------------------------------------------------------------------------------

_HARNESS = Path(__file__).with_name("atheris_codec.py")


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed")
@pytest.mark.timeout(120)
def test_atheris_harness_runs_briefly() -> None:
    """A short coverage-guided run (the harness runs longer by hand, see its docstring)."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(_HARNESS), "-runs=3000", "-max_len=1024", "-seed=1"],
        cwd=root,
        capture_output=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
