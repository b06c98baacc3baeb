"""Connection rate: N MQTT 3.1.1 clients connecting with a bounded number of CONNECTs
outstanding, and the CPU every mesh process spends per connect.

`python -m bench.connects [--clients N] [--outstanding K] [--rounds R] [--mosquitto]
[--persistent] [--profile SECONDS]` starts a mesh (bench/broker.py's settings: no cap per IP,
log level WARNING), runs `loadgen.connect_rate` R times against node 0 and prints, per round,
connects/s and CPU milliseconds per connect of each mesh process (utime + stime from
/proc/<pid>/stat). `--mosquitto` runs the same rounds against `mosquitto` in the same run.
`--profile S`: py-spy records the session service, node 0 and the rules service for S
seconds of the first round (raw collapsed stacks next to the mesh's data dir, paths printed).
Numbers are measurements of this machine, never assertions.

The scenario itself is `loadgen.connect_rate`, the same as make bench's connection-rate row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import loadgen
from bench.broker import starling_launcher
from bench.machine import cpu_seconds, open_files_to_hard_limit, python_loop_seconds
from bench.mosquitto import medians_line, on_mosquitto
from services.cli.launcher import Launcher, Mesh

CLIENTS = int(os.environ.get("BENCH_CONNECT_CLIENTS", "10000"))
OUTSTANDING = 64


def start_mesh(folder: Path, nodes: int = 2) -> tuple[Launcher, Mesh]:
    launcher = starling_launcher(folder, nodes)
    return launcher, launcher.start()


def _quiet(pids: dict[str, int], seconds: float = 30.0) -> None:
    """Wait until the mesh has done what the last round left (releases of closed clients):
    no process used more than 5% of a core over half a second."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        before = {n: cpu_seconds(p) for n, p in pids.items()}
        time.sleep(0.5)
        if all(cpu_seconds(p) - before[n] < 0.025 for n, p in pids.items()):
            return


def _profile(pids: dict[str, int], folder: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    spy = Path(sys.executable).parent / "py-spy"
    procs = []
    for name in ("session", "connection-0", "rules"):
        out = folder / f"profile-{name}.txt"
        print(f"  py-spy {name} -> {out}", flush=True)
        procs.append(
            subprocess.Popen(
                [
                    str(spy),
                    "record",
                    "-p",
                    str(pids[name]),
                    "-f",
                    "raw",
                    "-d",
                    str(int(seconds)),
                    "-r",
                    "200",
                    "--gil",
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return procs


def run_rounds(
    name: str,
    port: int,
    pids: dict[str, int],
    args: argparse.Namespace,
    profile_dir: Path | None = None,
) -> list[float]:
    import uvloop

    rates = []
    for r in range(args.rounds):
        _quiet(pids)
        before = {n: cpu_seconds(p) for n, p in pids.items()}
        before["load generator"] = time.process_time()
        spies = _profile(pids, profile_dir, args.profile) if profile_dir and r == 0 else []
        cpu: dict[str, float] = {}

        def read_cpu(cpu: dict[str, float] = cpu, before: dict[str, float] = before) -> None:
            # Connecting only: read before the releases of the closed clients weigh.
            cpu.update({n: cpu_seconds(p) - before[n] for n, p in pids.items()})
            cpu["load generator"] = time.process_time() - before["load generator"]

        async def one_round(read_cpu: Callable[[], None] = read_cpu) -> loadgen.ConnectRate:
            res = await loadgen.connect_rate(
                port, args.clients, args.outstanding, clean=not args.persistent
            )
            read_cpu()  # before the clients close: their releases are not connecting
            res.close()
            await asyncio.sleep(0.5)
            return res

        res = uvloop.run(one_round())
        for s in spies:
            s.wait()
        rates.append(res.rate)
        per = ", ".join(
            f"{n} {1000 * c / max(res.connected, 1):.2f}" for n, c in cpu.items() if c >= 0.01
        )
        print(
            f"{name} round {r + 1}: {res.connected:,}/{res.attempted:,} accepted in "
            f"{res.seconds:.1f} s = {res.rate:,.0f} connects/s; CPU ms/connect: {per}",
            flush=True,
        )
    return rates


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.connects")
    p.add_argument("--clients", type=int, default=CLIENTS)
    p.add_argument("--outstanding", type=int, default=OUTSTANDING)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--persistent", action="store_true", help="clean session 0 clients")
    p.add_argument("--mosquitto", action="store_true", help="the same rounds against mosquitto")
    p.add_argument("--profile", type=float, default=0.0, help="py-spy seconds, first round")
    args = p.parse_args()
    open_files_to_hard_limit()
    started = time.perf_counter()
    loop_s = python_loop_seconds()
    print(f"calibration: 10M-step for loop {loop_s:.2f} s; load {os.getloadavg()}", flush=True)
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        launcher, mesh = start_mesh(Path(tmp) / "starling")
        try:
            pids = {c.name: c.pid for c in mesh.components}
            port = mesh.by_name("connection-0").port
            rates = run_rounds("Starling", port, pids, args, Path(tmp) if args.profile else None)
            summary["Starling"] = statistics.median(rates)
            if args.profile:
                for f in Path(tmp).glob("profile-*.txt"):
                    keep = Path(tempfile.gettempdir()) / f.name
                    keep.write_bytes(f.read_bytes())
                    print(f"  kept {keep}")
        finally:
            launcher.stop()
        if args.mosquitto:
            found = on_mosquitto(
                Path(tmp) / "mosquitto",
                lambda b: run_rounds("Mosquitto", b.port, {"mosquitto": b.pid}, args),
            )
            if found:
                summary["Mosquitto"] = statistics.median(found)
    line = medians_line(summary, "/s")
    print(f"median connects/s: {line}; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
