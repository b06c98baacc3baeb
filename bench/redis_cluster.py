"""CONNECT rate of two connection nodes on one Redis versus a three-primary Redis Cluster
(issue 42): every CONNECT is one registry script on the tenant's slot, so this measures what
the cluster client (slot routing, a pipeline per shard) costs or saves on this machine.

`python -m bench.redis_cluster [rounds]` (default 3) prints a markdown table (`make bench`
runs it as an extra). Two meshes of two nodes each, started side by side (`Launcher(redis=
...)`: standalone and cluster); rounds alternate between them, so load from elsewhere on a
shared machine weighs on both alike. A round opens BENCH_CONNECT_CLIENTS (default 4,000)
MQTT 3.1.1 clean-session clients, half on each node at once, at most 64 CONNECTs outstanding
per node, then closes them and waits for both meshes to go quiet. Rows: the median round's
connects/s and the CPU milliseconds per CONNECT of the session service and of the Redis
server(s), summed.
Clients of several tenants spread the registry over the cluster's shards; here they are all
in tenant `default` (one slot), the worst case for a cluster and the usual one for a bench.
Numbers are measurements of this machine, never assertions.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import loadgen
from bench.broker import starling_launcher
from bench.machine import cpu_seconds
from services.cli.launcher import Launcher

CLIENTS = int(os.environ.get("BENCH_CONNECT_CLIENTS", "4000"))
OUTSTANDING = 64


@dataclass(frozen=True, slots=True)
class Round:
    rate: float  # connects/s, both nodes together
    connected: int
    session_ms: float  # session service CPU per CONNECT
    redis_ms: float  # every Redis server's CPU per CONNECT, summed


def _pids(launcher: Launcher, kind: str, prefix: str = "") -> list[int]:
    return [
        c.pid
        for c in launcher.mesh.components
        if c.pid and (c.kind == kind if kind else c.name.startswith(prefix))
    ]


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def _quiet(pids: list[int], limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = _cpu(pids)
        time.sleep(0.5)
        if _cpu(pids) - before < 0.05:
            return


async def _round(launcher: Launcher) -> Round:
    ports = [launcher.mesh.by_name(f"connection-{i}").port for i in range(2)]
    session, redis = _pids(launcher, "", "session"), _pids(launcher, "redis")
    s0, r0 = _cpu(session), _cpu(redis)
    began = time.perf_counter()
    results = await asyncio.gather(
        *(loadgen.connect_rate(p, CLIENTS // 2, OUTSTANDING) for p in ports)
    )
    seconds = max(r.seconds for r in results) or time.perf_counter() - began
    connected = sum(r.connected for r in results)
    s1, r1 = _cpu(session), _cpu(redis)
    for r in results:
        r.close()
    per = 1000 / max(connected, 1)
    return Round(connected / seconds, connected, (s1 - s0) * per, (r1 - r0) * per)


def measure(modes: list[str], rounds: int, folder: Path) -> dict[str, list[Round]]:
    launchers = {m: starling_launcher(folder / m, nodes=2, redis=m) for m in modes}
    try:
        for launcher in launchers.values():
            launcher.start(timeout_s=90)
        every = [c.pid for lc in launchers.values() for c in lc.mesh.components if c.pid]
        out: dict[str, list[Round]] = {m: [] for m in modes}
        for _ in range(rounds):
            for mode, launcher in launchers.items():
                out[mode].append(asyncio.run(_round(launcher)))
                _quiet(every)
        return out
    finally:
        for launcher in launchers.values():
            launcher.stop()


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(
        f"| Redis | connects/s (median of {rounds}) | rounds | session CPU ms/CONNECT "
        "| Redis CPU ms/CONNECT |"
    )
    print("|---|---|---|---|---|")
    labels = {"standalone": "one redis-server", "cluster": "3-primary cluster"}
    with tempfile.TemporaryDirectory(prefix="bench-redis-cluster-") as tmp:
        measured = measure(list(labels), rounds, Path(tmp))
    for mode, label in labels.items():
        res = measured[mode]
        mid = sorted(res, key=lambda r: r.rate)[len(res) // 2]
        texts = ", ".join(f"{r.rate:,.0f}" for r in res)
        short = "" if mid.connected == CLIENTS else f" ({mid.connected:,} of {CLIENTS:,})"
        print(
            f"| {label} | {mid.rate:,.0f}{short} | {texts} | "
            f"{statistics.median(r.session_ms for r in res):.2f} | "
            f"{statistics.median(r.redis_ms for r in res):.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
