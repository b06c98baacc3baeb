"""Publisher/subscriber pairs, closed loop: the rate and the broker's CPU per message, for
measuring one change to the publish path before and after without a whole `make bench`.

`python -m bench.pairs [--qos Q] [--rounds R] [--seconds S] [--mosquitto] [--profile S]`
starts a mesh (bench/broker.py's settings), warms it up with one short round, then runs R
rounds of 8 pairs at QoS Q (64 messages in flight per pair, 64-byte payloads: the scenario
of make bench's "8 pairs, closed loop" rows, `loadgen.throughput`) and prints each round's
rate and CPU microseconds per message of node 0 and of every mesh process; `--mosquitto`
runs the same rounds against `mosquitto` in the same run; `--profile S`: py-spy records
node 0 for S seconds of the first round (raw collapsed stacks, path printed; py-spy on
PATH or beside this Python). Numbers are
measurements of this machine, never assertions.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop

from bench import loadgen
from bench.broker import Broker, start_starling
from bench.machine import python_loop_seconds
from bench.mosquitto import medians_line, on_mosquitto

PAIRS = 8
WINDOW = 64


def _round(b: Broker, qos: int, seconds: float) -> loadgen.Result:
    return uvloop.run(
        loadgen.throughput(
            b.port, PAIRS, PAIRS, "pairs", qos, seconds, window=WINDOW, cpu_pids=b.pids
        )
    )


def run_rounds(b: Broker, args: argparse.Namespace, profile: Path | None) -> list[float]:
    """Each round's line printed; the rounds' rates returned."""
    _round(b, args.qos, 1.0)  # warm-up: connections, route copies, caches
    rates = []
    for r in range(args.rounds):
        spy = None
        if profile is not None and r == 0:
            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            cmd = [exe, "record", "-p", str(b.pid), "-d", str(args.profile), "-r", "200"]
            spy = subprocess.Popen([*cmd, "-f", "raw", "-o", str(profile), "--nonblocking"])
            print(f"  py-spy {b.name} -> {profile}", flush=True)
        res = _round(b, args.qos, args.seconds)
        if spy is not None:
            spy.wait()
        rates.append(res.rate)
        every = sum(res.cpu_s) / max(res.received, 1) * 1e6
        print(
            f"{b.name} round {r + 1}: {res.rate:,.0f} msg/s; CPU per message: "
            f"{res.cpu_us_per_message(0):.1f} µs ({every:.1f} µs all processes)",
            flush=True,
        )
    return rates


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pairs")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--mosquitto", action="store_true", help="the same rounds against mosquitto")
    p.add_argument("--profile", type=int, default=0, help="py-spy seconds, first round")
    args = p.parse_args()
    print(f"calibration: 10M-step for loop {python_loop_seconds():.2f} s", flush=True)
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        b = start_starling(Path(tmp) / "starling")
        try:
            profile = Path(tempfile.gettempdir()) / "pairs-node.raw" if args.profile else None
            summary["Starling"] = statistics.median(run_rounds(b, args, profile))
        finally:
            b.stop()
        if args.mosquitto:
            rates = on_mosquitto(Path(tmp) / "mosquitto", lambda m: run_rounds(m, args, None))
            if rates:
                summary["Mosquitto"] = statistics.median(rates)
    print(f"median: {medians_line(summary, ' msg/s')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
