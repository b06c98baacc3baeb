"""Connection rate: N MQTT 3.1.1 clients connecting with a bounded number of CONNECTs
outstanding, and the CPU every mesh process spends per connect.

`python -m bench.connects [--clients N] [--outstanding K] [--rounds R] [--mosquitto]
[--persistent] [--profile SECONDS]` starts a mesh (bench/run.py's settings: no cap per IP,
log level WARNING), runs `connection_rate` R times against node 0 and prints, per round,
connects/s and CPU milliseconds per connect of each mesh process (utime + stime from
/proc/<pid>/stat). `--mosquitto` runs the same rounds against `mosquitto` in the same run.
`--profile S`: py-spy records the session service and node 0 for S seconds of the first
round (raw collapsed stacks next to the mesh's data dir, paths printed).
Numbers are measurements of this machine, never assertions.

`connection_rate(port)` is the scenario function for bench/run.py: it returns a
`loadgen.Result` whose `rate` is CONNACKs per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import loadgen
from services.cli.launcher import Launcher, Mesh

CLIENTS = int(os.environ.get("BENCH_CONNECT_CLIENTS", "10000"))
OUTSTANDING = 64
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


async def connection_rate(
    port: int,
    clients: int = CLIENTS,
    outstanding: int = OUTSTANDING,
    clean: bool = True,
    prefix: str = "",
    before_close: Callable[[], None] | None = None,
) -> loadgen.Result:
    """Open `clients` connections, `outstanding` CONNECTs in flight at a time; every one stays
    open until all have their CONNACK (as devices do), then all close. `received`: CONNACKs
    that accepted (return code 0), `seconds`: first CONNECT to last CONNACK; `before_close`
    runs once all are in, before the clients close."""
    tag = prefix or f"c{time.monotonic_ns() % 10**8}"
    loop = asyncio.get_running_loop()
    made: list[loadgen.Client] = []
    accepted = 0
    sem = asyncio.Semaphore(outstanding)

    async def one(i: int) -> None:
        nonlocal accepted
        async with sem:
            try:
                _, proto = await loop.create_connection(
                    lambda: loadgen.Client(f"{tag}-{i}", clean=clean), "127.0.0.1", port
                )
                made.append(proto)
                ack = await asyncio.wait_for(proto.connack, 30)
                if ack.reason_code == 0:
                    accepted += 1
            except (OSError, TimeoutError):
                pass

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    if before_close is not None:
        before_close()
    for c in made:
        if c.transport is not None:
            c.transport.close()
    await asyncio.sleep(0.5)
    return loadgen.Result(sent=clients, received=accepted, seconds=elapsed)


def start_mesh(folder: Path, nodes: int = 2) -> tuple[Launcher, Mesh]:
    launcher = Launcher(
        folder,
        nodes=nodes,
        mqtt_port=0,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "WARNING",
            # Every bench client comes from 127.0.0.1: no cap per address.
            "STARLING_MAX_CONNECTIONS_PER_IP": "0",
        },
    )
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
    for name in ("session", "connection-0"):
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
        spies = _profile(pids, profile_dir, args.profile) if profile_dir and r == 0 else []
        cpu: dict[str, float] = {}

        def read_cpu(cpu: dict[str, float] = cpu, before: dict[str, float] = before) -> None:
            # Connecting only: read before the releases of the closed clients weigh.
            cpu.update({n: cpu_seconds(p) - before[n] for n, p in pids.items()})

        res = uvloop.run(
            connection_rate(port, args.clients, args.outstanding, not args.persistent, "", read_cpu)
        )
        for s in spies:
            s.wait()
        rates.append(res.rate)
        per = ", ".join(
            f"{n} {1000 * c / max(res.received, 1):.2f}" for n, c in cpu.items() if c >= 0.01
        )
        print(
            f"{name} round {r + 1}: {res.received:,}/{res.sent:,} accepted in {res.seconds:.1f} s"
            f" = {res.rate:,.0f} connects/s; CPU ms/connect: {per}",
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
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.perf_counter()
    loop_s = time.perf_counter()
    for _ in range(10_000_000):
        pass
    loop_s = time.perf_counter() - loop_s
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
            from bench.run import start_mosquitto

            broker = start_mosquitto(Path(tmp) / "mosquitto")
            if broker is None:
                print("mosquitto not installed")
            else:
                try:
                    rates = run_rounds("Mosquitto", broker.port, {"mosquitto": broker.pid}, args)
                    summary["Mosquitto"] = statistics.median(rates)
                finally:
                    broker.stop()
    line = ", ".join(f"{k} {v:,.0f}/s" for k, v in summary.items())
    if "Mosquitto" in summary:
        line += f" (ratio {summary['Starling'] / summary['Mosquitto']:.2f}x)"
    print(f"median connects/s: {line}; total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
