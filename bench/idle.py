"""What idle clients cost: N MQTT 3.1.1 clients connect to one node and stay silent (keep
alive 120 s), then the CPU every mesh process spends over `--seconds` of nothing.

`python -m bench.idle [--clients N] [--seconds S]` starts a mesh as bench/connects.py does,
connects N clean session clients, measures, closes them, then does the same with N clean
session 0 clients (each a persistent session whose queue the node delivers from), and
prints a markdown table: each process's share of a core while the clients idle (make
bench's section "Idle clients"). Numbers are measurements of this machine, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from bench import loadgen
from bench.connects import start_mesh
from bench.machine import cpu_seconds, open_files_to_hard_limit

SETTLE_S = 5.0  # after the last CONNACK: events, first polls and the like


async def _idle_share(
    port: int, pids: dict[str, int], clients: int, clean: bool, seconds: float
) -> tuple[int, dict[str, float]]:
    res = await loadgen.connect_rate(port, clients, 64, clean=clean)
    await asyncio.sleep(SETTLE_S)
    before = {n: cpu_seconds(pid) for n, pid in pids.items()}
    await asyncio.sleep(seconds)
    share = {n: (cpu_seconds(pid) - before[n]) / seconds for n, pid in pids.items()}
    res.close()
    await asyncio.sleep(SETTLE_S)  # their disconnects are not the next round's
    return res.connected, share


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle")
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    open_files_to_hard_limit()
    import uvloop

    rows: list[tuple[str, int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        launcher, mesh = start_mesh(Path(tmp) / "starling")
        try:
            pids = {c.name: c.pid for c in mesh.components}
            port = mesh.by_name("connection-0").port

            async def run() -> None:
                for kind, clean in (("clean session", True), ("persistent session", False)):
                    n, share = await _idle_share(port, pids, args.clients, clean, args.seconds)
                    rows.append((kind, n, share))

            uvloop.run(run())
        finally:
            launcher.stop()
    names = [n for n in rows[0][2] if any(r[2][n] >= 0.0005 for r in rows)]
    print(f"% of a core per process over {args.seconds:g} idle seconds ({SETTLE_S:g} s after")
    print("the last CONNACK); connection-0 holds the clients, connection-1 is a node without any.")
    print()
    print("| clients | " + " | ".join(names) + " | all |")
    print("|---|" + "---:|" * (len(names) + 1))
    for kind, n, share in rows:
        cells = [f"{100 * share[name]:.1f}" for name in names]
        print(f"| {n:,} {kind} | " + " | ".join(cells) + f" | {100 * sum(share.values()):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
