"""`make bench`: micro-benchmarks, then the same load against Starling and Mosquitto side by
side; writes docs/benchmarks.md. Numbers are measurements of this machine, never assertions.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import loadgen, micro
from services.cli.launcher import Launcher
from services.cli.ports import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent
IDLE_CONNECTIONS = int(os.environ.get("BENCH_IDLE_CONNECTIONS", "10000"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "4"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Broker:
    def __init__(
        self, name: str, port: int, pid: int, stop: Callable[[], None], second_port: int = 0
    ) -> None:
        self.name, self.port, self.pid, self.stop = name, port, pid, stop
        self.second_port = second_port  # another node of the same mesh (Starling only)


def start_starling(folder: Path) -> Broker:
    launcher = Launcher(
        folder,
        nodes=2,
        mqtt_port=0,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "WARNING",
            "STARLING_MAX_QUEUED_MESSAGES": "100000",
            # Every bench client comes from 127.0.0.1: no cap per address.
            "STARLING_MAX_CONNECTIONS_PER_IP": "0",
        },
    )
    mesh = launcher.start()
    node = mesh.by_name("connection-0")
    return Broker("Starling", node.port, node.pid, launcher.stop, mesh.by_name("connection-1").port)


def start_mosquitto(folder: Path) -> Broker | None:
    binary = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if binary is None:
        return None
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\n"
        "max_queued_messages 100000\npersistence false\nlog_type error\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            proc.kill()
            return None
        time.sleep(0.05)

    def stop() -> None:
        proc.terminate()
        proc.wait(10)

    version = subprocess.run([binary, "-h"], capture_output=True, text=True).stdout.split("\n")[0]
    return Broker(
        version.replace("mosquitto version", "Mosquitto").strip() or "Mosquitto",
        port,
        proc.pid,
        stop,
    )


SCENARIOS: list[tuple[str, Callable[[int], Awaitable[loadgen.Result]]]] = [
    ("8 pairs, QoS 0", lambda p: loadgen.throughput(p, 8, 8, "pairs", 0, SECONDS)),
    ("8 pairs, QoS 1", lambda p: loadgen.throughput(p, 8, 8, "pairs", 1, SECONDS)),
    ("fan-in 8 -> 1, QoS 0", lambda p: loadgen.throughput(p, 8, 1, "fan-in", 0, SECONDS)),
    ("fan-in 8 -> 1, QoS 1", lambda p: loadgen.throughput(p, 8, 1, "fan-in", 1, SECONDS)),
    ("fan-out 1 -> 8, QoS 0", lambda p: loadgen.throughput(p, 1, 8, "fan-out", 0, SECONDS)),
    ("fan-out 1 -> 8, QoS 1", lambda p: loadgen.throughput(p, 1, 8, "fan-out", 1, SECONDS)),
]
LATENCY = [("latency at 5,000 msg/s, QoS 0", 0), ("latency at 5,000 msg/s, QoS 1", 1)]


CROSS = [("8 pairs across two nodes, QoS 0", 0), ("8 pairs across two nodes, QoS 1", 1)]
PERSISTENT = [
    ("8 pairs, QoS 1, persistent subscribers (embedded store)", "pairs"),
    ("fan-in 8 -> 1, QoS 1, persistent subscriber", "fan-in"),
]


async def measure(broker: Broker) -> dict[str, str]:
    out: dict[str, str] = {}
    rates: dict[str, float] = {}
    await idle(broker, out)
    for name, fn in SCENARIOS:
        r = await fn(broker.port)
        rates[name] = r.rate
        out[name] = f"{r.rate:,.0f} msg/s"
        print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    for name, qos in LATENCY:
        r = await loadgen.latency(broker.port, qos)
        out[name] = f"p50 {r.pct(0.5):.2f} ms, p99 {r.pct(0.99):.2f} ms"
        print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    for name, mode in PERSISTENT:
        if broker.second_port:  # Mosquitto's in-memory session store is not comparable
            pubs, subs = (8, 8) if mode == "pairs" else (8, 1)
            r = await loadgen.throughput(broker.port, pubs, subs, mode, 1, SECONDS, persistent=True)
            rates[name] = r.rate
            out[name] = f"{r.rate:,.0f} msg/s"
        else:
            out[name] = "n/a (no durable store)"
        print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    name = "8 pairs, QoS 1: persistent / transient"
    transient, persistent = rates.get("8 pairs, QoS 1"), rates.get(PERSISTENT[0][0])
    out[name] = f"{persistent / transient:.2f}x" if transient and persistent else "n/a"
    print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    name = "latency at 1,000 msg/s, QoS 1, persistent subscriber"
    if broker.second_port:
        r = await loadgen.latency(broker.port, 1, rate_per_s=1000, persistent=True)
        out[name] = f"p50 {r.pct(0.5):.2f} ms, p99 {r.pct(0.99):.2f} ms"
    else:
        out[name] = "n/a"
    print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    for name, qos in CROSS:
        if broker.second_port:
            r = await loadgen.throughput(
                broker.port, 8, 8, "pairs", qos, SECONDS, sub_port=broker.second_port
            )
            out[name] = f"{r.rate:,.0f} msg/s"
        else:
            out[name] = "n/a (one process)"
        print(f"  {broker.name:<12} {name:<28} {out[name]}", flush=True)
    return out


async def idle(broker: Broker, out: dict[str, str]) -> None:
    """Memory of idle connections, measured first, before load leaves freed memory around."""
    gc.collect()
    await asyncio.sleep(1.0)
    before = rss_kib(broker.pid)
    made = await loadgen.idle_connections(broker.port, IDLE_CONNECTIONS)
    await asyncio.sleep(2.0)
    after = rss_kib(broker.pid)
    loadgen.close_idle()
    per = (after - before) * 1024 / made if made else float("nan")
    out["idle connections held"] = f"{made:,} of {IDLE_CONNECTIONS:,}"
    out["memory per idle connection"] = f"{per / 1024:.1f} KiB"
    print(
        f"  {broker.name:<12} idle: {out['idle connections held']}, "
        f"{out['memory per idle connection']}",
        flush=True,
    )
    await asyncio.sleep(1.0)


def write_report(micro_rates: dict[str, float], results: dict[str, dict[str, str]]) -> None:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (bench/run.py). Measured on this machine; never asserted "
        "in tests.",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.machine()}",
        "- Load generator: bench/loadgen.py (one uvloop process, the project's codec), run "
        "identically against each broker; 64-byte payloads; Starling runs as `starling up` "
        "with two connection nodes (NATS, Redis and all seven services); unless a row says "
        "otherwise, publishers and subscribers use the same node.",
        "",
        "## Hot paths (one core, CPython)",
        "",
        "| operation | rate |",
        "|---|---:|",
        *[f"| {k} | {v:,.0f} /s |" for k, v in micro_rates.items()],
        "",
        "## End to end, side by side",
        "",
        "| scenario | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    names = list(next(iter(results.values())).keys())
    for n in names:
        lines.append(f"| {n} | " + " | ".join(r.get(n, "-") for r in results.values()) + " |")
    notes = ROOT / "docs" / "benchmarks-notes.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print("micro-benchmarks", flush=True)
    micro_rates = micro.run_all()
    for k, v in micro_rates.items():
        print(f"  {k:<55} {v:>12,.0f} /s", flush=True)
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for start in (start_starling, start_mosquitto):
            broker = start(Path(tmp) / start.__name__)
            if broker is None:
                print("  mosquitto not installed: Starling only", flush=True)
                continue
            try:
                import uvloop

                results[broker.name] = uvloop.run(measure(broker))
            finally:
                broker.stop()
    write_report(micro_rates, results)
    print("wrote docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
