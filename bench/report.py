"""The report of `make bench`: docs/benchmarks.md with the machine, the calibration, the
hot paths, the side-by-side table (with Starling / Mosquitto ratios) and the Starling-only
extra scenarios, each run as its own process (`python -m bench.X`)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.machine import Machine
from bench.mosquitto import Calibration
from bench.scenarios import (
    CLOSED_LOOP_ROUNDS,
    CONNECTIONS,
    OUTSTANDING_CONNECTS,
    PERSISTENT_ROUNDS,
    SECONDS,
    WINDOW,
    Cell,
)

ROOT = Path(__file__).resolve().parent.parent


def ratio(starling: Cell | None, other: Cell | None) -> str:
    if starling is None or other is None or not starling.value or not other.value:
        return "-"
    if math.isnan(starling.value) or math.isnan(other.value):
        return "-"
    return f"{starling.value / other.value:.2f}x"


def table_lines(table: dict[str, dict[str, Cell]], names: list[str]) -> list[str]:
    starling, others = names[0], names[1:]
    head = ["scenario", *names, *[f"{starling} / {o}" for o in others]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row, cells in table.items():
        texts = [cells[n].text if n in cells else "-" for n in names]
        ratios = [ratio(cells.get(starling), cells.get(o)) for o in others]
        lines.append(f"| {row} | " + " | ".join([*texts, *ratios]) + " |")
    return lines


# Starling-only scenarios, each its own process (python -m MODULE) printing a markdown table:
# (section title, module). BENCH_EXTRAS=0 skips them.
EXTRAS = [
    ("Router boot: routing snapshot versus scan and full replay", "bench.boot"),
    ("Spark over the embedded store: scan rate and queue compaction", "bench.analytics"),
    ("Rules engine: one process, 10 versus 1,000 rules", "bench.rules"),
    ("Persistent path: fsync per commit versus store_sync=normal", "bench.persistent"),
    ("Scale-out: 1 node x 1 router versus 2 nodes x 2 routers, persistent QoS 1", "bench.scale"),
    ("Idle clients: what silent connections and sessions cost", "bench.idle"),
    ("CONNECT rate: one Redis versus a three-primary Redis Cluster", "bench.redis_cluster"),
    ("Console pages with 10,000 connected clients", "bench.console_pages"),
    ("HTTP publish API and CoAP gateway", "bench.gateway"),
    ("Fan-in: 10,000 publishers to a durable shared group of 4, per queue kind", "bench.fanin"),
]


def run_extras() -> list[str]:
    """The extra scenarios' own reports, one section each (their stdout, as printed)."""
    if os.environ.get("BENCH_EXTRAS", "1") == "0":
        return []
    lines: list[str] = []
    for title, module in EXTRAS:
        print(f"{title} (python -m {module})", flush=True)
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", module],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        out = done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr[-500:]}"
        print(out, flush=True)
        lines += ["", f"## {title}", "", f"`python -m {module}`, {time.monotonic() - began:.0f} s:"]
        lines += ["", out]
    return lines


def _how_measured() -> list[str]:
    """The report's notes on how each kind of row is measured."""
    return [
        "- Load generator: bench/loadgen.py, one uvloop process reading MQTT frames itself, "
        "run identically against each broker, each scenario on one broker and then at once "
        "on the other; MQTT 3.1.1, 64-byte payloads. Starling runs as `starling up` with two "
        "connection nodes (NATS, Redis and all seven services); unless a row says otherwise, "
        "publishers and subscribers use the same node. A rate marked 'load generator at N% "
        "of a core' may be the generator's limit rather than the broker's. The ratio column "
        "divides Starling's figure by Mosquitto's: rates, CPU, memory; p99 for latency.",
        "- Open loop: publishers send as fast as the socket takes it (QoS 1: at most 200 "
        f"unacknowledged). Closed loop: each publisher keeps at most {WINDOW} messages "
        "published but not yet received by its subscriber. A row is one "
        f"{SECONDS:g} s round unless it says it is a median; the closed-loop 8 pairs rows "
        f"are the round with the median rate of {CLOSED_LOOP_ROUNDS} (its CPU too).",
        "- Broker CPU per message: the broker process's CPU seconds (utime + stime from "
        "/proc/<pid>/stat) over the measured window divided by the messages delivered in it; "
        "for Starling the node the clients use, and in brackets all processes of the mesh.",
        f"- Connection rate: {CONNECTIONS:,} clean-session CONNECTs, at most "
        f"{OUTSTANDING_CONNECTS} waiting for their CONNACK at any time, from the first "
        "CONNECT to the last CONNACK; the clients then stay connected for the idle-memory "
        "rows and are closed before the next scenario.",
        f"- Persistent rows: {PERSISTENT_ROUNDS} rounds of transient QoS 1 pairs, persistent "
        "QoS 1 pairs and the 1,000 msg/s latency, back to back on one mesh; the rows give "
        "the medians (the ratio: the median of each round's persistent over transient).",
    ]


def write_report(
    machine: Machine,
    calibration: Calibration,
    micro_rates: dict[str, float],
    table: dict[str, dict[str, Cell]],
    names: list[str],
    extras: list[str],
) -> None:
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (bench/run.py). Measured on this machine; never asserted "
        "in tests.",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {machine.describe()}",
        f"- Code: commit {machine.commit}",
        f"- Calibration (this run): CPython {10_000_000:,}-step `for` loop in a function "
        f"{calibration.loop_s:.2f} s (best of 3); {calibration.mosquitto} (a Mosquitto "
        "started for this figure alone)",
        *_how_measured(),
        "",
        "## Hot paths (one core, CPython)",
        "",
        "| operation | rate |",
        "|---|---:|",
        *[f"| {k} | {v:,.0f} /s |" for k, v in micro_rates.items()],
        "",
        "## End to end, side by side",
        "",
        *table_lines(table, names),
        *extras,
    ]
    notes = ROOT / "docs" / "benchmarks-notes.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(lines) + "\n")
