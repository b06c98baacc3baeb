"""Fan-in to one topic: many publishers, one subscription, QoS 1 — a durable shared group of
4 members per queue kind, beside a plain subscription, and Mosquitto under the same load.

`python -m bench.fanin [--publishers N] [--seconds S] [--window W] [--no-mosquitto]`

N publisher connections (default 10,000, half on each node of a two-node mesh) take turns:
each PUBLISH goes out on the next publisher, at QoS 1, carrying its send time. The offered
load is closed-loop on the deliveries: at most W messages (default 200) published and not yet
received by the subscription, so the rate is what the broker sustains at a bounded backlog,
and the latency (publish to delivery, p50/p99) is measured at that backlog. Subscriptions:

- `plain`: one subscriber with a clean session (NATS fan-out; nothing queued);
- `persistent`: one subscriber with a persistent session (its own queue, in the store);
- `group store` / `group redis`: `$share/g/<topic>`, 4 members with persistent sessions
  (3.1.1 clean session 0), so the group owns a queue (docs/persistence.md, "Durable shared
  groups"), in the SQLite store or in Redis Streams (`queue_store_default=redis`, the mesh's
  Redis); a mesh each;
- Mosquitto: the same plain subscription and a 4-member `$share` group (persistent
  sessions, in memory: Mosquitto stores nothing on disk here).

Prints one line per scenario: delivered msg/s, p50 and p99 in ms. Numbers are measurements
of this machine, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench import loadgen
from bench.broker import Broker, settle, starling_launcher
from bench.client import Client, connect
from bench.mosquitto import on_mosquitto
from services.common.mqtt import Publish, encode_publish

MEMBERS = 4
PAD = b"x" * 56  # 64-byte payloads: the send time (8 bytes) and padding


@dataclass(frozen=True, slots=True)
class Figures:
    rate: float  # deliveries per second over the measured window
    p50_ms: float
    p99_ms: float

    def line(self, name: str) -> str:
        rate = f"{self.rate:>8,.0f} msg/s"
        return f"{name:<30} {rate}   p50 {self.p50_ms:6.1f} ms   p99 {self.p99_ms:7.1f} ms"


async def _drive(
    pubs: list[Client], subs: list[Client], topic: str, window: int, stop: asyncio.Event
) -> None:
    """Publish in turn on every publisher, keeping at most `window` undelivered."""
    sent, turn = 0, 0
    pids = [0] * len(pubs)
    base = sum(s.received for s in subs)
    while not stop.is_set():
        room = window - (sent - (sum(s.received for s in subs) - base))
        if room <= 0:
            await asyncio.sleep(0.001)
            continue
        for _ in range(min(room, 64)):
            i = turn % len(pubs)
            turn += 1
            p = pubs[i]
            if p.transport is None or p.transport.is_closing():
                continue
            pids[i] = pids[i] % 65535 + 1
            body = struct.pack("d", time.perf_counter()) + PAD
            p.transport.write(encode_publish(Publish(topic, body, 1, False, False, pids[i]), 4))
            sent += 1
        await asyncio.sleep(0)


async def _measure(
    pubs: list[Client], subs: list[Client], topic: str, window: int, seconds: float
) -> Figures:
    stop = asyncio.Event()
    task = asyncio.create_task(_drive(pubs, subs, topic, window, stop))
    await asyncio.sleep(0.5)  # warm up
    for s in subs:
        s.latencies.clear()
        s.record = True
    start_rx, start = sum(s.received for s in subs), time.perf_counter()
    await asyncio.sleep(seconds)
    rx, elapsed = sum(s.received for s in subs) - start_rx, time.perf_counter() - start
    for s in subs:
        s.record = False
    stop.set()
    await task
    lat = sorted(x * 1000 for s in subs for x in s.latencies)
    return Figures(rx / elapsed, _pct(lat, 0.5), _pct(lat, 0.99))


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _subscribe(port: int, topic: str, n: int, persistent: bool, tag: str) -> list[Client]:
    subs = [await connect(port, f"f-{tag}-{i}", clean=not persistent) for i in range(n)]
    for s in subs:
        await s.subscribe(topic, 1)
    return subs


async def _scenarios(b: Broker, args: argparse.Namespace, which: list[str]) -> dict[str, Figures]:
    """Open the publishers (half on each node when there are two), then each scenario in
    `which` ("plain", "persistent", "group") on a fresh topic; the publishers close at the
    end."""
    ports = [b.port, b.second_port] if b.second_port else [b.port]
    per = args.publishers // len(ports)
    made = [await loadgen.connect_rate(port, per, outstanding=128, timeout_s=60) for port in ports]
    pubs = [c for m in made for c in m.clients]
    took = max(m.seconds for m in made)
    print(f"  {b.name}: {len(pubs):,} publishers connected in {took:.1f} s", flush=True)
    out: dict[str, Figures] = {}
    try:
        for kind in which:
            tag = f"{kind}{time.monotonic_ns() % 10**8}"
            topic = f"fanin/{tag}"
            members = MEMBERS if kind == "group" else 1
            filt = f"$share/g{tag}/{topic}" if kind == "group" else topic
            subs = await _subscribe(b.port, filt, members, kind != "plain", tag)
            out[kind] = await _measure(pubs, subs, topic, args.window, args.seconds)
            for s in subs:
                if s.transport is not None:
                    s.transport.close()
            await settle(b, 1.0)
    finally:
        for c in pubs:
            if c.transport is not None:
                c.transport.close()
    return out


def _starling(
    folder: Path, args: argparse.Namespace, env: dict[str, str], which: list[str]
) -> dict[str, Figures]:
    launcher = starling_launcher(folder, env=env)
    mesh = launcher.start()
    node = mesh.by_name("connection-0")
    b = Broker(
        "Starling",
        node.port,
        node.pid,
        launcher.stop,
        mesh.by_name("connection-1").port,
        [c.pid for c in mesh.components if c.pid and c.pid != node.pid],
    )
    try:
        return uvloop.run(_scenarios(b, args, which))
    finally:
        b.stop()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fanin")
    p.add_argument("--publishers", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--window", type=int, default=200)
    p.add_argument("--no-mosquitto", action="store_true")
    args = p.parse_args()
    print(f"{args.publishers:,} QoS 1 publishers to one topic, {args.window} in flight", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = _starling(Path(tmp) / "store", args, {}, ["plain", "persistent", "group"])
        redis = _starling(
            Path(tmp) / "redis", args, {"STARLING_QUEUE_STORE_DEFAULT": "redis"}, ["group"]
        )
        mosq = None
        if not args.no_mosquitto:
            mosq = on_mosquitto(
                Path(tmp) / "mosquitto",
                lambda m: uvloop.run(_scenarios(m, args, ["plain", "group"])),
            )
    print(store["plain"].line("Starling plain subscription"))
    print(store["persistent"].line("Starling persistent, store"))
    print(store["group"].line(f"Starling group of {MEMBERS}, store"))
    print(redis["group"].line(f"Starling group of {MEMBERS}, redis"))
    if mosq:
        print(mosq["plain"].line("Mosquitto plain subscription"))
        print(mosq["group"].line(f"Mosquitto $share group of {MEMBERS}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
