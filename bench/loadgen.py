"""MQTT load generator on the project's codec and raw asyncio protocols (uvloop).

Used identically against Starling and Mosquitto so the numbers compare. Publishers write
pre-encoded PUBLISH packets in batches (QoS 0) or keep a window of unacknowledged ones (QoS 1);
subscribers count what arrives and, in latency mode, read a send timestamp from the payload.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass, field

from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
    encode_publish,
)


class Client(asyncio.Protocol):
    def __init__(self, name: str, on_publish: object = None, clean: bool = True) -> None:
        self.name = name
        self.clean = clean
        self.decoder = Decoder(4)
        self.transport: asyncio.Transport | None = None
        self.connack = asyncio.get_running_loop().create_future()
        self.suback: asyncio.Future[None] | None = None
        self.received = 0
        self.acks = 0
        self.latencies: list[float] = []
        self.record = False
        self.ack_event = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.qos1 = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(encode(Connect(self.name, 4, clean_start=self.clean, keepalive_s=120), 4))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        acks = bytearray()
        for p in self.decoder.feed(data):
            t = type(p)
            if t is Publish:
                self.received += 1
                if self.record:
                    self.latencies.append(
                        time.perf_counter() - struct.unpack_from("d", p.payload)[0]
                    )
                if p.qos == 1:
                    acks += encode(PubAck(p.packet_id or 0), 4)
            elif t is PubAck:
                self.acks += 1
                self.ack_event.set()
            elif t is ConnAck:
                self.connack.set_result(p)
            elif t is SubAck and self.suback is not None:
                self.suback.set_result(None)
        if acks and self.transport is not None:
            self.transport.write(bytes(acks))

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

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(q * len(s)))]


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
    pid = 0
    sent = 0
    while not stop.is_set():
        while sent - c.acks >= window:
            c.ack_event.clear()
            try:
                await asyncio.wait_for(c.ack_event.wait(), 1)
            except TimeoutError:
                if stop.is_set():
                    return
        room = window - (sent - c.acks)
        buf = bytearray()
        for _ in range(min(room, 32)):
            pid = pid % 65535 + 1
            buf += encode_publish(Publish(topic, payload, 1, False, False, pid), 4)
            sent += 1
        c.transport.write(bytes(buf))
        counter[0] = sent
        await c.writable.wait()


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
) -> Result:
    """mode: 'pairs' (pub i -> sub i), 'fan-in' (all pubs -> 1 sub), 'fan-out' (1 pub -> all).
    `sub_port`: subscribers connect there (another node) instead of `port`."""
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
    payload = b"x" * payload_size
    tasks = [
        asyncio.create_task(
            _publisher(
                p,
                f"b/{tag}/{i}" if mode != "fan-out" else f"b/{tag}/0",
                qos,
                stop,
                counters[i],
                payload,
            )
        )
        for i, p in enumerate(publishers)
    ]
    await asyncio.sleep(1.0)  # warm up
    start_rx = sum(s.received for s in subscribers)
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    rx = sum(s.received for s in subscribers) - start_rx
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in subscribers + publishers:
        assert c.transport is not None
        c.transport.close()
    await asyncio.sleep(0.3)
    return Result(sum(c[0] for c in counters), rx, elapsed)


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


async def idle_connections(port: int, n: int) -> int:
    """Open `n` idle MQTT connections; return how many got a CONNACK."""
    loop = asyncio.get_running_loop()
    made: list[Client] = []
    sem = asyncio.Semaphore(200)

    async def one(i: int) -> None:
        async with sem:
            try:
                _, proto = await loop.create_connection(
                    lambda: Client(f"idle-{i}"), "127.0.0.1", port
                )
                await asyncio.wait_for(proto.connack, 30)
                made.append(proto)
            except (OSError, TimeoutError):
                pass

    await asyncio.gather(*(one(i) for i in range(n)))
    idle_connections.clients = made  # type: ignore[attr-defined]
    return len(made)


def close_idle() -> None:
    for c in getattr(idle_connections, "clients", []):
        if c.transport is not None:
            c.transport.close()
