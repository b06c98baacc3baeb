"""What a throughput run's publishers write and when.

Open loop (`open_loop`): QoS 0 writes pre-encoded PUBLISH packets in batches as fast as the
socket takes them; QoS 1 keeps a window of unacknowledged ones. Closed loop (`closed_loop`,
pairs only): a publisher keeps at most `window` messages published but not yet received by
its subscriber, so the broker is measured at a bounded backlog instead of with its queues
full; `wake_every` lets a waiting one notice a stall and the stop. Each publisher is the only
writer of its `Tally`, which bench/loadgen.py reads once the publishers have stopped.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.client import Client
from bench.frames import Qos1Frames
from services.common.mqtt import Publish, encode_publish

STALL_S = 2.0
QOS0_BATCH = 64  # open loop: PUBLISH packets per write
QOS1_BATCH = 32  # open loop: a QoS 1 publisher waits until this many more fit its window


@dataclass(frozen=True, slots=True)
class Flow:
    """What one publisher sends: `payload` to `topic` at `qos` until `stop` is set."""

    topic: str
    qos: int
    payload: bytes
    stop: asyncio.Event


@dataclass(slots=True)
class Tally:
    """One publisher's counts, written by that publisher alone."""

    sent: int = 0
    stalls: int = 0  # closed loop: windows given up as lost after STALL_S without a delivery
    max_in_flight: int = 0  # closed loop: most messages sent and not yet received


async def open_loop(*, pub: Client, flow: Flow, tally: Tally, ack_window: int = 200) -> None:
    """Publish as fast as the socket (QoS 0) or `ack_window` unacknowledged messages (QoS 1)
    allow, until `flow.stop`."""
    assert pub.transport is not None
    if flow.qos == 0:
        await _qos0_batches(pub, flow, tally)
    else:
        await _qos1_window(pub, flow, tally, ack_window)


async def _qos0_batches(pub: Client, flow: Flow, tally: Tally) -> None:
    assert pub.transport is not None
    batch = encode_publish(Publish(flow.topic, flow.payload), 4) * QOS0_BATCH
    while not flow.stop.is_set():
        await pub.writable.wait()
        pub.transport.write(batch)
        tally.sent += QOS0_BATCH
        await asyncio.sleep(0)


async def _qos1_window(pub: Client, flow: Flow, tally: Tally, window: int) -> None:
    assert pub.transport is not None
    frames = Qos1Frames(flow.topic, flow.payload)
    pub.wake = wake = asyncio.Event()
    sent = 0
    while not flow.stop.is_set():
        while sent - pub.acks > window - QOS1_BATCH:
            pub.wake_acks = sent - window + QOS1_BATCH  # room for a batch
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 1)
            except TimeoutError:
                if flow.stop.is_set():
                    return
        room = min(window - (sent - pub.acks), QOS1_BATCH)
        pub.transport.write(frames.take(room))
        sent += room
        tally.sent = sent
        await pub.writable.wait()


@dataclass(slots=True)
class _Backlog:
    """A closed-loop pair's messages: sent, counted as lost, and when the subscriber last got
    one (owned by the pair's `closed_loop`)."""

    sent: int
    lost: int
    last_rx: int
    last_change: float

    def in_flight(self, received: int) -> int:
        in_flight = self.sent - self.lost - received
        if in_flight < 0:  # messages counted lost arrived after all
            self.lost += in_flight
            in_flight = 0
        return in_flight

    def stalled(self, received: int, in_flight: int) -> bool:
        """True when nothing arrived for STALL_S with messages in flight: those now count as
        lost, so the window opens again."""
        if received != self.last_rx or in_flight <= 0:
            self.last_rx, self.last_change = received, time.monotonic()
        elif time.monotonic() - self.last_change > STALL_S:
            self.lost += in_flight
            self.last_change = time.monotonic()
            return True
        return False


async def closed_loop(
    *, pub: Client, sub: Client, flow: Flow, tally: Tally, window: int, ack_window: int = 200
) -> None:
    """Keep at most `window` messages published but not yet received by `sub` (pairs only;
    `pub.wake` is the pair's shared event).

    Refills once a quarter of the window is free, so a write carries several messages rather
    than one per delivery. A broker may drop QoS 0 messages: if nothing arrives for STALL_S
    with a full window, its messages count as lost (a stall) and the window opens again.
    """
    assert pub.transport is not None and pub.wake is not None
    wake = pub.wake
    one = encode_publish(Publish(flow.topic, flow.payload), 4)
    frames = Qos1Frames(flow.topic, flow.payload)
    refill = max(1, window // 4)
    backlog = _Backlog(sent=0, lost=0, last_rx=sub.received, last_change=time.monotonic())
    while not flow.stop.is_set():
        in_flight = backlog.in_flight(sub.received)
        room = window - in_flight
        if flow.qos:
            room = min(room, ack_window - (backlog.sent - pub.acks))
        if room < refill:
            if backlog.stalled(sub.received, in_flight):
                tally.stalls += 1
                continue
            sub.wake_rx = backlog.sent - backlog.lost - window + refill  # deliveries that free
            pub.wake_acks = backlog.sent - ack_window + refill if flow.qos else 0
            wake.clear()
            await wake.wait()
            continue
        pub.transport.write(frames.take(room) if flow.qos else one * room)
        backlog.sent += room
        in_flight = backlog.sent - backlog.lost - sub.received
        tally.max_in_flight = max(tally.max_in_flight, in_flight)
        tally.sent = backlog.sent
        await pub.writable.wait()


async def wake_every(clients: list[Client], stop: asyncio.Event, period_s: float = 0.25) -> None:
    """Closed loop: wake waiting publishers now and then, so a stall is noticed and the stop."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except TimeoutError:
            pass
        for c in clients:
            if c.wake is not None:
                c.wake.set()  # regardless of the marks
