"""What idle clients cost: N MQTT 3.1.1 clients connect to one node and stay silent (keep
alive 120 s), then the CPU every mesh process spends over `--seconds` of nothing.

`python -m bench.idle [--clients N] [--persistent] [--seconds S]` starts a mesh as
bench/connects.py does, connects the clients (`--persistent`: clean session 0, each with a
queue the node delivers from) and prints each process's share of a core while they idle.
Numbers are measurements of this machine, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
from pathlib import Path

from bench import loadgen
from bench.connects import start_mesh
from bench.machine import cpu_seconds


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle")
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--persistent", action="store_true", help="clean session 0 clients")
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        launcher, mesh = start_mesh(Path(tmp) / "starling")
        try:
            pids = {c.name: c.pid for c in mesh.components}
            port = mesh.by_name("connection-0").port

            async def run() -> None:
                res = await loadgen.connect_rate(port, args.clients, 64, clean=not args.persistent)
                kind = "persistent" if args.persistent else "clean"
                print(f"{res.connected:,} {kind} clients connected", flush=True)
                await asyncio.sleep(5)  # what connecting left (events, first polls) settles
                before = {n: cpu_seconds(pid) for n, pid in pids.items()}
                await asyncio.sleep(args.seconds)
                share = {
                    n: (cpu_seconds(pid) - before[n]) / args.seconds for n, pid in pids.items()
                }
                print(
                    f"idle, % of a core over {args.seconds:g} s: "
                    + ", ".join(f"{n} {100 * v:.1f}" for n, v in share.items() if v >= 0.001)
                )
                res.close()
                await asyncio.sleep(0.5)

            uvloop.run(run())
        finally:
            launcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
