"""Scale-out of the persistent path (issue 18): QoS 1 throughput to persistent sessions with
1 node x 1 router against 2 nodes x 2 routers, and the CPU each process spends per message.

`python -m bench.scale [rounds]` (default 1) prints a markdown table (`make bench` runs it as
an extra). Five meshes, one after the other:

- `1 node x 1 router` and `2 nodes x 2 routers`, each as shipped (nodes append from their
  copies of the route table, docs/persistence.md: the router is not on the path of a
  publish) and with `route_copy_max_subscriptions` 0 (every publish goes node -> router ->
  queue, so the routers carry it); `2 nodes x 2 routers x 2 queues` also splits the queues'
  partitions between two queue instances (one queue instance in the others);
- 8 publisher/subscriber pairs, 3.1.1 persistent subscribers, QoS 1, open loop (each
  publisher keeps 200 unacknowledged), a pair's publisher and subscriber on one node; with
  two nodes, four pairs on each (two generators at once, in one event loop).

CPU per message is utime + stime from /proc/<pid>/stat over the measured window, divided by
the messages delivered in it, per process of the mesh (instances of one service summed), and
the generator's own (`time.process_time`). On a machine of C cores the mesh's rate is at
most C / (sum of CPU per message over every process, generator included): that, not the
number of instances, bounds it (docs/benchmarks-notes.md, "Scaling out"). Numbers are
measurements of this machine, never assertions; on a shared machine other load weighs on
them (run it twice and compare).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench import loadgen
from bench.broker import starling_launcher
from bench.scenarios import SECONDS
from services.cli.launcher import Launcher

PAIRS = 8
# Column groups of the CPU table: a process belongs to the first group its name starts with.
GROUPS = ("connection", "router", "queue", "session", "nats", "redis")


@dataclass
class Layout:
    label: str
    nodes: int
    routers: int
    copies: bool  # nodes route from their copies of the route table (the default)
    queues: int = 1

    def env(self) -> dict[str, str]:
        return {} if self.copies else {"STARLING_ROUTE_COPY_MAX_SUBSCRIPTIONS": "0"}


LAYOUTS = [
    Layout("1 node x 1 router", 1, 1, True),
    Layout("2 nodes x 2 routers", 2, 2, True),
    Layout("2 nodes x 2 routers x 2 queues", 2, 2, True, 2),
    Layout("1 node x 1 router, every publish via the router", 1, 1, False),
    Layout("2 nodes x 2 routers, every publish via a router", 2, 2, False),
]


@dataclass
class Row:
    rate: float  # messages delivered per second
    cpu_us: dict[str, float]  # group -> CPU microseconds per message
    loadgen_us: float


def group_of(name: str) -> str:
    return next((g for g in GROUPS if name.startswith(g)), "other")


async def measure(launcher: Launcher) -> Row:
    mesh = launcher.mesh
    ports = [mesh.by_name(f"connection-{i}").port for i in range(launcher.nodes)]
    procs = [c for c in mesh.components if c.pid]
    pids = [c.pid for c in procs]
    per_node = PAIRS // len(ports)
    # The first generator measures every process over its window; the others run alongside
    # over the same seconds (started together, same warm-up), and their deliveries count.
    results = await asyncio.gather(
        *(
            loadgen.throughput(
                port,
                per_node,
                per_node,
                "pairs",
                1,
                SECONDS,
                persistent=True,
                cpu_pids=pids if i == 0 else (),
            )
            for i, port in enumerate(ports)
        )
    )
    received = sum(r.received for r in results)
    seconds = results[0].seconds
    cpu: dict[str, float] = defaultdict(float)
    for comp, used in zip(procs, results[0].cpu_s, strict=True):
        cpu[group_of(comp.name)] += used
    per_msg = {g: s / received * 1e6 for g, s in cpu.items()} if received else {}
    # One process runs every generator: its CPU over the window is in each result alike.
    return Row(received / seconds, per_msg, results[0].loadgen_cpu_s / max(received, 1) * 1e6)


def run_layout(folder: Path, layout: Layout, rounds: int) -> list[Row]:
    import uvloop

    launcher = starling_launcher(
        folder,
        nodes=layout.nodes,
        env=layout.env(),
        instances={"router": layout.routers, "queue": layout.queues},
    )
    launcher.start()
    try:
        rows = []
        for i in range(rounds):
            row = uvloop.run(measure(launcher))
            rows.append(row)
            print(
                f"{layout.label} round {i + 1}: {row.rate:,.0f} msg/s",
                file=sys.stderr,
                flush=True,
            )
        return rows
    finally:
        launcher.stop()


def median_row(rows: list[Row]) -> Row:
    groups = {g for r in rows for g in r.cpu_us}
    return Row(
        statistics.median(r.rate for r in rows),
        {g: statistics.median(r.cpu_us.get(g, 0.0) for r in rows) for g in groups},
        statistics.median(r.loadgen_us for r in rows),
    )


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    began = time.monotonic()
    results: list[tuple[Layout, Row]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, layout in enumerate(LAYOUTS):
            rows = run_layout(Path(tmp) / f"layout{n}", layout, rounds)
            results.append((layout, median_row(rows)))
    cols = [*GROUPS, "other"]
    print(
        f"Persistent QoS 1, {PAIRS} pairs (3.1.1 persistent subscribers, open loop), "
        f"{SECONDS:.0f} s per round, median of {rounds} round(s) per layout, one mesh per "
        f"layout ({time.monotonic() - began:.0f} s in all). CPU: microseconds per delivered "
        "message, per kind of process (instances summed), from /proc/<pid>/stat.\n"
    )
    print(
        "| layout | msg/s | "
        + " | ".join(f"{c} µs" for c in cols)
        + " | mesh total µs | mesh cores busy | generator µs |"
    )
    print("|---|---:|" + "---:|" * (len(cols) + 3))
    for layout, row in results:
        total = sum(row.cpu_us.values())
        cells = " | ".join(f"{row.cpu_us.get(c, 0.0):.0f}" for c in cols)
        # Cores the mesh kept busy: below the machine's, CPU is not what bounds the rate.
        busy = row.rate * total / 1e6
        print(
            f"| {layout.label} | {row.rate:,.0f} | {cells} | {total:.0f} | {busy:.2f} "
            f"| {row.loadgen_us:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
