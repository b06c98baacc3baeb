"""MQTT load generator on the project's codec and raw asyncio protocols (uvloop): the
scenarios and their measurement. Used identically against Starling and Mosquitto so the
numbers compare.

`throughput` connects subscribers and publishers, runs the publishers (bench/publishers.py:
open or closed loop), and measures deliveries and CPU over a window after a warm-up.
`latency` paces timestamped PUBLISHes and reads the delay from each delivery's payload.
`connect_rate` opens many clients with a bounded number of CONNECTs outstanding and times
their CONNACKs. The client is bench/client.py, the wire bytes bench/frames.py, the reports
bench/result.py; callers use them through this module.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.client import Client, connect
from bench.machine import cpu_seconds
from bench.publishers import Flow, Tally, closed_loop, open_loop, wake_every
from bench.result import ConnectRate, Result
from services.common.mqtt import Publish, encode_publish

__all__ = ["Client", "ConnectRate", "Result", "connect", "connect_rate", "latency", "throughput"]


@dataclass(frozen=True, slots=True)
class _Load:
    """One throughput run's shape, as `throughput` was asked for it."""

    port: int
    sub_port: int
    pubs: int
    subs: int
    mode: str
    qos: int
    persistent: bool
    window: int
    payload: bytes
    tag: str

    def sub_topic(self, i: int) -> str:
        return f"b/{self.tag}/{i}" if self.mode == "pairs" else f"b/{self.tag}/#"

    def pub_topic(self, i: int) -> str:
        return f"b/{self.tag}/{i}" if self.mode != "fan-out" else f"b/{self.tag}/0"


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
    load = _Load(
        port=port,
        sub_port=sub_port,
        pubs=pubs,
        subs=subs,
        mode=mode,
        qos=qos,
        persistent=persistent,
        window=window,
        payload=b"x" * payload_size,
        tag=f"{mode}{qos}{time.monotonic_ns() % 10**8}",
    )
    subscribers, publishers = await _connect_clients(load)
    await asyncio.sleep(0.3)
    stop = asyncio.Event()
    tallies = [Tally() for _ in publishers]
    tasks = _start_publishers(load, subscribers, publishers, tallies, stop)
    await asyncio.sleep(1.0)  # warm up
    measured = await _measure(subscribers, seconds, cpu_pids)
    await _stop(stop, tasks, publishers, subscribers + publishers)
    return replace(
        measured,
        sent=sum(t.sent for t in tallies),
        stalls=sum(t.stalls for t in tallies),
        max_in_flight=max((t.max_in_flight for t in tallies), default=0),
    )


async def _connect_clients(load: _Load) -> tuple[list[Client], list[Client]]:
    """The subscribers, subscribed, then the publishers."""
    subscribers = [
        await connect(load.sub_port or load.port, f"s-{load.tag}-{i}", clean=not load.persistent)
        for i in range(load.subs)
    ]
    for i, s in enumerate(subscribers):
        await s.subscribe(load.sub_topic(i), load.qos)
    publishers = [await connect(load.port, f"p-{load.tag}-{i}") for i in range(load.pubs)]
    return subscribers, publishers


def _start_publishers(
    load: _Load,
    subscribers: list[Client],
    publishers: list[Client],
    tallies: list[Tally],
    stop: asyncio.Event,
) -> list[asyncio.Task[None]]:
    """One task per publisher (publisher i writes `tallies[i]`), and in closed loop the
    waker; `throughput` gathers them after setting `stop`."""
    tasks = []
    for i, (p, tally) in enumerate(zip(publishers, tallies, strict=True)):
        flow = Flow(topic=load.pub_topic(i), qos=load.qos, payload=load.payload, stop=stop)
        if load.window:
            p.wake = subscribers[i].wake = asyncio.Event()
            job = closed_loop(pub=p, sub=subscribers[i], flow=flow, tally=tally, window=load.window)
        else:
            job = open_loop(pub=p, flow=flow, tally=tally)
        tasks.append(asyncio.create_task(job))
    if load.window:
        tasks.append(asyncio.create_task(wake_every(publishers, stop)))
    return tasks


async def _stop(
    stop: asyncio.Event,
    tasks: list[asyncio.Task[None]],
    publishers: list[Client],
    clients: list[Client],
) -> None:
    """Stop the publishers (waking any that wait), wait for their tasks, close every client."""
    stop.set()
    for p in publishers:
        if p.wake is not None:
            p.wake.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in clients:
        assert c.transport is not None
        c.transport.close()
    await asyncio.sleep(0.3)


async def _measure(subscribers: list[Client], seconds: float, cpu_pids: Sequence[int]) -> Result:
    """Deliveries to `subscribers` over the next `seconds`, the CPU `cpu_pids` and this
    process used meanwhile."""
    start_rx = sum(s.received for s in subscribers)
    cpu_start = [cpu_seconds(pid) for pid in cpu_pids]
    gen_start = time.process_time()
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    rx = sum(s.received for s in subscribers) - start_rx
    elapsed = time.perf_counter() - start
    cpu = [cpu_seconds(pid) - c0 for pid, c0 in zip(cpu_pids, cpu_start, strict=True)]
    gen_cpu = time.process_time() - gen_start
    return Result(received=rx, seconds=elapsed, cpu_s=cpu, loadgen_cpu_s=gen_cpu)


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
