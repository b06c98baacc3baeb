"""Bounded hash work and failure back-off (services/session/throttle.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.session.throttle import Backoff, GateFullError, HashGate, peer_ip
from tests.poll import eventually


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_starts_at_the_threshold_doubles_and_caps() -> None:
    clock = Clock()
    b = Backoff(threshold=3, base_s=1.0, max_s=4.0, window_s=300, max_keys=10, clock=clock)
    b.failed("u")
    b.failed("u")
    assert b.blocked_for("u") == 0
    waits = []
    for _ in range(4):
        b.failed("u")
        waits.append(b.blocked_for("u"))
    assert waits == [1.0, 2.0, 4.0, 4.0]
    clock.now += 4.5
    assert b.blocked_for("u") == 0  # the period is over: it may try again
    b.succeeded("u")
    b.failed("u")
    assert b.blocked_for("u") == 0  # a success cleared the count


def test_old_failures_are_forgotten_and_memory_is_bounded() -> None:
    clock = Clock()
    b = Backoff(threshold=2, base_s=1.0, max_s=4.0, window_s=60, max_keys=3, clock=clock)
    b.failed("u")
    clock.now += 61
    b.failed("u")
    assert b.blocked_for("u") == 0
    for key in "abcd":
        b.failed(key)
    assert len(b) == 3


@pytest.mark.parametrize(
    ("peer", "ip"),
    [("1.2.3.4:5678", "1.2.3.4"), ("::1:5678", "::1"), ("ws:10.0.0.1", "10.0.0.1"), ("?", "?")],
)
def test_peer_ip(peer: str, ip: str) -> None:
    assert peer_ip(peer) == ip


async def test_hash_gate_runs_at_most_n_and_refuses_beyond_the_queue() -> None:
    gate = HashGate(max_concurrent=2, max_queued=1)
    release = threading.Event()
    running = 0
    peak = 0
    lock = threading.Lock()

    def work() -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(5)
        with lock:
            running -= 1
        return 1

    tasks = [asyncio.create_task(gate.run(work)) for _ in range(3)]
    # The gate has no event to wait on.
    await eventually(lambda: gate.in_flight >= 3, 5, "three in flight", every_s=0.001)
    with pytest.raises(GateFullError):
        await gate.run(work)
    release.set()
    assert await asyncio.gather(*tasks) == [1, 1, 1]
    assert peak == 2 and gate.refused == 1
    assert await gate.run(work) == 1  # room again
    gate.close()
