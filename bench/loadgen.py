"""MQTT load generator on the project's codec and raw asyncio protocols (uvloop).

Used identically against Starling and Mosquitto so the numbers compare. Open loop: publishers
write pre-encoded PUBLISH packets in batches as fast as the socket takes them (QoS 0) or keep a
window of unacknowledged ones (QoS 1). Closed loop: each publisher keeps at most `window`
messages published but not yet received by its subscriber, so the broker is measured at a
bounded backlog instead of with its queues full. Subscribers count what arrives and, in
latency mode, read a send timestamp from the payload. `connect_rate` opens many clients with a
bounded number of CONNECTs outstanding and times their CONNACKs.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.machine import cpu_seconds
from services.common.mqtt import (
    ConnAck,
    Connect,
    Publish,
    Subscribe,
    Subscription,
    encode,
    encode_publish,
)


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


class Client(asyncio.Protocol):
    """An MQTT 3.1.1 client that counts deliveries, acknowledges QoS 1 ones and PUBACKs."""

    def __init__(self, name: str, on_publish: object = None, clean: bool = True) -> None:
        self.name = name
        self.clean = clean
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[ConnAck] = asyncio.get_running_loop().create_future()
        self.suback: asyncio.Future[None] | None = None
        self.received = 0
        self.acks = 0
        self.latencies: list[float] = []
        self.record = False
        self.ack_event = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.qos1 = False
        # Set once `received` and `acks` reach the wake_* marks (a waiting publisher's refill
        # point), not on every packet: a wake-up per delivery would make the generator, not
        # the broker, the bottleneck. Closed loop: shared by a publisher and its subscriber.
        self.wake: asyncio.Event | None = None
        self.wake_rx = 0
        self.wake_acks = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(encode(Connect(self.name, 4, clean_start=self.clean, keepalive_s=120), 4))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        frames, used = split_frames(buf)
        acks = bytearray()
        for first, start, _end in frames:
            kind = first >> 4
            if kind == 3:  # PUBLISH
                self.received += 1
                qos = (first >> 1) & 3
                if qos or self.record:
                    at = start + 2 + (buf[start] << 8 | buf[start + 1])  # past the topic
                    if qos:
                        acks += b"\x40\x02" + buf[at : at + 2]  # PUBACK (QoS 1 only here)
                        at += 2
                    if self.record:
                        sent_at = struct.unpack_from("d", buf, at)[0]
                        self.latencies.append(time.perf_counter() - sent_at)
            elif kind == 4:  # PUBACK
                self.acks += 1
                self.ack_event.set()
            elif kind == 2:  # CONNACK: flags, return code
                if not self.connack.done():
                    self.connack.set_result(ConnAck(bool(buf[start] & 1), buf[start + 1]))
            elif kind == 9 and self.suback is not None and not self.suback.done():
                self.suback.set_result(None)
        del buf[:used]
        if acks and self.transport is not None:
            self.transport.write(bytes(acks))
        if self.wake is not None and self.received >= self.wake_rx and self.acks >= self.wake_acks:
            self.wake.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError("closed before CONNACK"))
        if self.wake is not None:
            self.wake.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def subscribe(self, topic: str, qos: int) -> None:
        self.suback = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(encode(Subscribe(1, (Subscription(topic, qos),)), 4))
        await asyncio.wait_for(self.suback, 10)


async def connect(port: int, name: str, clean: bool = True) -> Client:
    """`clean=False`: a 3.1.1 persistent session (its QoS 1 messages go through its queue)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: Client(name, clean=clean), "127.0.0.1", port)
    await asyncio.wait_for(proto.connack, 10)
    return proto


@dataclass
class Result:
    sent: int = 0
    received: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    # CPU seconds each of `cpu_pids` used during the measured window, in their order.
    cpu_s: list[float] = field(default_factory=list)
    loadgen_cpu_s: float = 0.0  # this process, same window: is the generator the bottleneck?
    stalls: int = 0  # closed loop: windows given up as lost after STALL_S without a delivery
    max_in_flight: int = 0  # closed loop: most messages of one pair sent and not yet received

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0

    def cpu_us_per_message(self, index: int = 0) -> float:
        """CPU microseconds of `cpu_pids[index]` per message delivered in the window."""
        if not self.received or index >= len(self.cpu_s):
            return float("nan")
        return self.cpu_s[index] / self.received * 1e6

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(q * len(s)))]


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


async def _publisher(
    c: Client,
    topic: str,
    qos: int,
    stop: asyncio.Event,
    counter: list[int],
    payload: bytes,
    window: int = 200,
) -> None:
    assert c.transport is not None
    if qos == 0:
        batch = encode_publish(Publish(topic, payload), 4) * 64
        while not stop.is_set():
            await c.writable.wait()
            c.transport.write(batch)
            counter[0] += 64
            await asyncio.sleep(0)
        return
    frames = Qos1Frames(topic, payload)
    c.wake = wake = asyncio.Event()
    sent = 0
    while not stop.is_set():
        while sent - c.acks > window - 32:
            c.wake_acks = sent - window + 32  # room for a batch of 32
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), 1)
            except TimeoutError:
                if stop.is_set():
                    return
        room = min(window - (sent - c.acks), 32)
        c.transport.write(frames.take(room))
        sent += room
        counter[0] = sent
        await c.writable.wait()


STALL_S = 2.0


async def _closed_publisher(
    c: Client,
    sub: Client,
    topic: str,
    qos: int,
    stop: asyncio.Event,
    counter: list[int],
    payload: bytes,
    window: int,
    stalls: list[int],
    max_in_flight: list[int],
    ack_window: int = 200,
) -> None:
    """Keep at most `window` messages published but not yet received by `sub` (pairs only).

    Refills once a quarter of the window is free, so a write carries several messages rather
    than one per delivery. A broker may drop QoS 0 messages: if nothing arrives for STALL_S
    with a full window, its messages count as lost (a stall) and the window opens again.
    """
    assert c.transport is not None and c.wake is not None
    wake = c.wake
    one = encode_publish(Publish(topic, payload), 4)
    frames = Qos1Frames(topic, payload)
    refill = max(1, window // 4)
    sent = lost = 0
    last_rx, last_change = sub.received, time.monotonic()
    while not stop.is_set():
        in_flight = sent - lost - sub.received
        if in_flight < 0:  # messages counted lost arrived after all
            lost += in_flight
            in_flight = 0
        room = window - in_flight
        if qos:
            room = min(room, ack_window - (sent - c.acks))
        if room < refill:
            if sub.received != last_rx or in_flight <= 0:
                last_rx, last_change = sub.received, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                lost += in_flight
                stalls[0] += 1
                last_change = time.monotonic()
                continue
            sub.wake_rx = sent - lost - window + refill  # deliveries that make room again
            c.wake_acks = sent - ack_window + refill if qos else 0
            wake.clear()
            await wake.wait()
            continue
        c.transport.write(frames.take(room) if qos else one * room)
        sent += room
        max_in_flight[0] = max(max_in_flight[0], sent - lost - sub.received)
        counter[0] = sent
        await c.writable.wait()


async def _wake_every(clients: list[Client], stop: asyncio.Event, period_s: float = 0.25) -> None:
    """Closed loop: wake waiting publishers now and then, so a stall is noticed and the stop."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except TimeoutError:
            pass
        for c in clients:
            if c.wake is not None:
                c.wake.set()  # regardless of the marks


async def throughput(
    port: int,
    pubs: int,
    subs: int,
    mode: str,
    qos: int,
    seconds: float = 4.0,
    payload_size: int = 64,
    sub_port: int = 0,
    persistent: bool = False,
    window: int = 0,
    cpu_pids: Sequence[int] = (),
) -> Result:
    """mode: 'pairs' (pub i -> sub i), 'fan-in' (all pubs -> 1 sub), 'fan-out' (1 pub -> all).
    `sub_port`: subscribers connect there (another node) instead of `port`.
    `window` > 0: closed loop (pairs only), at most `window` messages in flight per pair.
    `cpu_pids`: processes whose CPU seconds over the measured window go in `Result.cpu_s`."""
    if window and mode != "pairs":
        raise ValueError("closed loop needs pairs: a publisher waits for its own subscriber")
    tag = f"{mode}{qos}{time.monotonic_ns() % 10**8}"
    subscribers = [
        await connect(sub_port or port, f"s-{tag}-{i}", clean=not persistent) for i in range(subs)
    ]
    for i, s in enumerate(subscribers):
        await s.subscribe(f"b/{tag}/{i}" if mode == "pairs" else f"b/{tag}/#", qos)
    publishers = [await connect(port, f"p-{tag}-{i}") for i in range(pubs)]
    await asyncio.sleep(0.3)
    stop = asyncio.Event()
    counters = [[0] for _ in publishers]
    stalls, peak = [0], [0]
    payload = b"x" * payload_size
    tasks = []
    for i, p in enumerate(publishers):
        topic = f"b/{tag}/{i}" if mode != "fan-out" else f"b/{tag}/0"
        if window:
            p.wake = subscribers[i].wake = asyncio.Event()
            job = _closed_publisher(
                p, subscribers[i], topic, qos, stop, counters[i], payload, window, stalls, peak
            )
        else:
            job = _publisher(p, topic, qos, stop, counters[i], payload)
        tasks.append(asyncio.create_task(job))
    if window:
        tasks.append(asyncio.create_task(_wake_every(publishers, stop)))
    await asyncio.sleep(1.0)  # warm up
    start_rx = sum(s.received for s in subscribers)
    cpu_start = [cpu_seconds(pid) for pid in cpu_pids]
    gen_start = time.process_time()
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    rx = sum(s.received for s in subscribers) - start_rx
    elapsed = time.perf_counter() - start
    cpu = [cpu_seconds(pid) - c0 for pid, c0 in zip(cpu_pids, cpu_start, strict=True)]
    gen_cpu = time.process_time() - gen_start
    stop.set()
    for p in publishers:
        if p.wake is not None:
            p.wake.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in subscribers + publishers:
        assert c.transport is not None
        c.transport.close()
    await asyncio.sleep(0.3)
    return Result(
        sum(c[0] for c in counters),
        rx,
        elapsed,
        cpu_s=cpu,
        loadgen_cpu_s=gen_cpu,
        stalls=stalls[0],
        max_in_flight=peak[0],
    )


async def latency(
    port: int, qos: int, rate_per_s: int = 5000, seconds: float = 4.0, persistent: bool = False
) -> Result:
    tag = f"lat{qos}{time.monotonic_ns() % 10**8}"
    sub = await connect(port, f"s-{tag}", clean=not persistent)
    await sub.subscribe(f"l/{tag}", qos)
    pub = await connect(port, f"p-{tag}")
    assert pub.transport is not None
    await asyncio.sleep(0.3)
    # Pace on 1 ms ticks (the event loop's timer resolution) instead of spinning: a spinning
    # generator steals a core from the broker on a small machine and inflates its latency.
    pid = 0
    sent = 0
    start = time.perf_counter()
    warm_until = start + 1.0
    end = warm_until + seconds
    while (now := time.perf_counter()) < end:
        if not sub.record and now >= warm_until:
            sub.record = True
        due = int((now - start) * rate_per_s)
        while sent < due:
            pid = pid % 65535 + 1
            body = struct.pack("d", time.perf_counter()) + b"x" * 56
            pub.transport.write(
                encode_publish(
                    Publish(f"l/{tag}", body, qos, False, False, pid if qos else None), 4
                )
            )
            sent += 1
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.5)
    sub.record = False
    for c in (sub, pub):
        assert c.transport is not None
        c.transport.close()
    return Result(sent, len(sub.latencies), seconds, [x * 1000 for x in sub.latencies])


@dataclass
class ConnectRate:
    attempted: int
    connected: int  # CONNACK with return code 0
    seconds: float  # first CONNECT sent to last CONNACK received
    clients: list[Client] = field(default_factory=list, repr=False)

    @property
    def rate(self) -> float:
        return self.connected / self.seconds if self.seconds else 0.0

    def close(self) -> None:
        for c in self.clients:
            if c.transport is not None:
                c.transport.close()
        self.clients.clear()


async def connect_rate(
    port: int, n: int, outstanding: int = 64, timeout_s: float = 30.0, clean: bool = True
) -> ConnectRate:
    """Open `n` MQTT 3.1.1 clients (`clean`: clean session), at most `outstanding` of them
    between TCP connect and CONNACK at any time; the clients stay open (`close()` them)."""
    loop = asyncio.get_running_loop()
    made: list[Client] = []
    sem = asyncio.Semaphore(outstanding)
    tag = time.monotonic_ns() % 10**8
    last = [0.0]

    async def one(i: int) -> None:
        async with sem:
            proto: Client | None = None
            try:
                _, proto = await loop.create_connection(
                    lambda: Client(f"c-{tag}-{i}", clean=clean), "127.0.0.1", port
                )
                ack = await asyncio.wait_for(proto.connack, timeout_s)
            except (OSError, TimeoutError, ConnectionError):
                if proto is not None and proto.transport is not None:
                    proto.transport.close()
                return
            last[0] = time.perf_counter()
            made.append(proto)
            if ack.reason_code != 0:
                proto.transport.close()  # type: ignore[union-attr]

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    ok = [c for c in made if c.connack.result().reason_code == 0]
    return ConnectRate(n, len(ok), max(0.0, last[0] - start), ok)
