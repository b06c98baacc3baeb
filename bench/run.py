"""`make bench`: a calibration line, micro-benchmarks, then the same load against Starling and
Mosquitto side by side, scenario by scenario; writes docs/benchmarks.md. Numbers are
measurements of this machine, never assertions.

Calibration comes first, so a run can be compared with another machine's or day's: how long
this machine takes for a 10-million-step CPython `for` loop, and what a Mosquitto of its own
(started for that alone, so the table's Mosquitto starts fresh) moves in the 8-pairs QoS 0
open-loop scenario. Each scenario then runs on Starling and at once on Mosquitto, so load from
elsewhere on a shared machine weighs on both sides of a row's ratio alike.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench import micro
from bench.broker import Broker, start_starling
from bench.machine import open_files_to_hard_limit, this_machine
from bench.mosquitto import calibrate, start_mosquitto
from bench.report import ROOT, run_extras, table_lines, write_report
from bench.scenarios import CONNECTIONS, measure


def main() -> int:
    import uvloop

    began = time.monotonic()
    hard = open_files_to_hard_limit()
    if hard < CONNECTIONS + 1000:
        print(f"  RLIMIT_NOFILE hard limit {hard}: the connection rows will fall short")
    machine = this_machine(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        calibration = calibrate(Path(tmp) / "calibration")
        print(calibration.line(), flush=True)
        print(f"machine: {machine.describe()}; commit {machine.commit}", flush=True)
        print("micro-benchmarks", flush=True)
        micro_rates = micro.run_all()
        for k, v in micro_rates.items():
            print(f"  {k:<55} {v:>12,.0f} /s", flush=True)
        brokers: list[Broker] = []
        try:
            brokers.append(start_starling(Path(tmp) / "starling"))
            mosquitto = start_mosquitto(Path(tmp) / "mosquitto")
            if mosquitto is None:
                print("  mosquitto not installed: Starling only", flush=True)
            else:
                brokers.append(mosquitto)
            table = uvloop.run(measure(brokers))
        finally:
            for b in brokers:
                b.stop()
    names = [b.name for b in brokers]
    extras = run_extras()
    write_report(machine, calibration, micro_rates, table, names, extras)
    print()
    print(calibration.line())
    print("\n".join(table_lines(table, names)))
    print(f"wrote docs/benchmarks.md ({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
