"""The persistent QoS 1 rows of `make bench`, beside their transient reference, once per
embedded-store durability (`store_sync`), with the disk's own fsync latency beside them.

`python -m bench.persistent [rounds]` (default 2): for `store_sync` = full (an fsync per group
commit, the default) and normal (no fsync per commit: survives a killed process, not a power
cut), one mesh each, `rounds` times: "8 pairs, QoS 1" (transient), "8 pairs, QoS 1,
persistent subscribers" and "latency at 1,000 msg/s, QoS 1, persistent subscriber". The
persistent / transient ratio is taken within one round, so other load on a shared machine
weighs on both sides alike. Before that, the disk calibration: 500 single-row SQLite commits
(WAL, synchronous=FULL) 1 ms apart in the folder the meshes use, p50 and p99: the
floor that an fsync puts under every persistent PUBACK and delivery. `make bench` runs this
module and prints its markdown table. Numbers are measurements, never assertions.
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import loadgen
from bench.broker import start_starling
from bench.scenarios import SECONDS

MODES = ("full", "normal")


def disk_fsync_ms(folder: Path, n: int = 500) -> tuple[float, float]:
    db = sqlite3.connect(str(folder / "fsync.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
    took = []
    for _ in range(n):
        began = time.perf_counter()
        db.execute("BEGIN")
        db.execute("INSERT INTO t (v) VALUES (?)", (b"x" * 100,))
        db.execute("COMMIT")
        took.append((time.perf_counter() - began) * 1000)
        time.sleep(0.001)
    db.close()
    took.sort()
    return took[n // 2], took[int(n * 0.99)]


async def one_round(port: int) -> tuple[float, float, float, float]:
    transient = await loadgen.throughput(port, 8, 8, "pairs", 1, SECONDS)
    persistent = await loadgen.throughput(port, 8, 8, "pairs", 1, SECONDS, persistent=True)
    lat = await loadgen.latency(port, 1, rate_per_s=1000, seconds=SECONDS, persistent=True)
    return transient.rate, persistent.rate, lat.pct(0.5), lat.pct(0.99)


def main() -> int:
    import uvloop

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    table = [
        "| store_sync | transient QoS 1, 8 pairs | persistent QoS 1, 8 pairs | "
        "persistent / transient | latency at 1,000 msg/s, persistent |",
        "|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        p50, p99 = disk_fsync_ms(Path(tmp))
        for mode in MODES:
            rows: list[tuple[float, float, float, float]] = []
            broker = start_starling(Path(tmp) / mode, env={"STARLING_STORE_SYNC": mode})
            try:
                for i in range(rounds):
                    t, p, l50, l99 = uvloop.run(one_round(broker.port))
                    rows.append((t, p, l50, l99))
                    print(
                        f"{mode} round {i + 1}: transient {t:,.0f} msg/s, persistent "
                        f"{p:,.0f} msg/s (ratio {p / t:.2f}), persistent latency p50 "
                        f"{l50:.2f} ms p99 {l99:.2f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                broker.stop()
            med = [statistics.median(col) for col in zip(*rows, strict=True)]
            ratio = statistics.median(p / t for t, p, _, _ in rows)
            table.append(
                f"| {mode} | {med[0]:,.0f} msg/s | {med[1]:,.0f} msg/s | {ratio:.2f} | "
                f"p50 {med[2]:.2f} ms, p99 {med[3]:.2f} ms |"
            )
    print(
        f"Median of {rounds} rounds per mode, one mesh per mode. Disk calibration, same run: "
        f"a one-row SQLite commit with fsync (WAL, synchronous=FULL) takes p50 {p50:.2f} ms, "
        f"p99 {p99:.2f} ms here.\n"
    )
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
