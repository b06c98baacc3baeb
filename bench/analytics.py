"""Analytics benchmarks: the `starling` source's scan rate on 1 and 2 cores, and queue
compaction of a 10-million-row embedded store. `main()` prints a markdown table.

The store files are built directly with sqlite3 executemany (the schema of the real stores,
created by their own classes), which is far faster than appending through the queue service.

    python -m bench.analytics [--rows 10000000] [--scan-rows 2000000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

QUEUES_PER_TENANT = 100
ROWS_PER_QUEUE = 1000


async def _schemas(data: Path) -> None:
    """Create the store files with the services' own schema code."""
    from services.common.store.sqlite_queue import SqliteQueueStore
    from services.common.store.sqlite_router import SqliteRouterStore
    from services.common.store.sqlite_session import SqliteSessionStore

    for cls, name in (
        (SqliteQueueStore, "queues.db"),
        (SqliteSessionStore, "sessions.db"),
        (SqliteRouterStore, "router.db"),
    ):
        store = cls(data / name)
        await store.close()


def build_store(data: Path, rows: int, now_ms: int) -> dict[str, int]:
    """`rows` queue entries in queues of ROWS_PER_QUEUE. Of the queues: every 2nd has
    acked_through 300 with those rows still present (an ack whose delete did not land),
    every 10th belongs to an expired session; every 4th entry expired a minute ago. Returns
    the rows each category should remove."""
    asyncio.run(_schemas(data))
    queues = max(1, rows // ROWS_PER_QUEUE)
    q = sqlite3.connect(data / "queues.db")
    q.execute("PRAGMA synchronous=OFF")
    q.execute("PRAGMA journal_mode=OFF")
    payload = b"p" * 64
    expect = {"acked": 0, "expired": 0, "session_queues": 0}

    def entries(qn: int) -> list[tuple[object, ...]]:
        tenant, qid = f"t{qn // QUEUES_PER_TENANT}", f"c{qn}#1"
        return [
            (tenant, qid, 0, s, f"m{qn}-{s}", 1, payload, now_ms - 60_000 if s % 4 == 0 else 0, 0)
            for s in range(1, ROWS_PER_QUEUE + 1)
        ]

    q.execute("BEGIN")
    states = []
    for qn in range(queues):
        q.executemany(
            "INSERT INTO queue_entries (tenant, queue_id, bucket, seq, message_id, qos, data, "
            "expires_at_ms, released) VALUES (?,?,?,?,?,?,?,?,?)",
            entries(qn),
        )
        acked = 300 if qn % 2 == 0 else 0
        states.append(
            (
                f"t{qn // QUEUES_PER_TENANT}",
                f"c{qn}#1",
                ROWS_PER_QUEUE,
                acked,
                ROWS_PER_QUEUE - acked,
                0,
                0,
                (ROWS_PER_QUEUE - acked) * len(payload),  # bytes held
            )
        )
        if qn % 10 == 1:
            expect["session_queues"] += ROWS_PER_QUEUE
        else:
            expect["acked"] += acked
            expect["expired"] += sum(1 for s in range(acked + 1, ROWS_PER_QUEUE + 1) if s % 4 == 0)
    q.executemany(
        "INSERT INTO queue_state (tenant, queue_id, last_seq, acked_through, depth, dropped, "
        "delivered_through, bytes) VALUES (?,?,?,?,?,?,?,?)",
        states,
    )
    q.execute("COMMIT")
    q.close()
    s = sqlite3.connect(data / "sessions.db")
    s.executemany(
        "INSERT INTO sessions (tenant, client_id, incarnation, expiry_interval_s, connected, "
        "disconnected_at_ms, expires_at_ms, owner) VALUES (?,?,?,?,?,?,?,?)",
        [
            (f"t{qn // QUEUES_PER_TENANT}", f"c{qn}", 1, 60, 0, now_ms - 3_600_000,
             now_ms - 3_540_000 if qn % 10 == 1 else now_ms + 3_600_000, None)
            for qn in range(queues)
        ],
    )  # fmt: skip
    s.commit()
    s.close()
    return expect


def scan_rate(data: Path, master: str, repeats: int = 2) -> tuple[int, float]:
    """Rows/s of a full scan of queue_entries (all columns, blobs included), best of
    `repeats` after a warm-up."""
    from analytics.source import StoreConf, read
    from analytics.spark import session

    spark = session(master, app="bench-scan")

    def once() -> tuple[int, float]:
        # A new DataFrame each time: collecting one twice reuses its first run's shuffle.
        df = read(spark, StoreConf(sqlite=str(data)), "queue_entries")
        t = time.monotonic()
        row = df.selectExpr("sum(length(data))", "count(*)").collect()[0]
        return int(row[1]), time.monotonic() - t

    try:
        once()  # warm-up: Python workers started, pages cached
        runs = [once() for _ in range(repeats)]
        return runs[0][0], min(secs for _, secs in runs)
    finally:
        spark.stop()


def compaction(data: Path, master: str, now_ms: int) -> tuple[dict[str, object], float]:
    from analytics.config import load_analytics_settings
    from analytics.jobs import queue_compaction
    from analytics.jobs.context import JobContext
    from analytics.source import StoreConf
    from analytics.spark import session

    spark = session(master, app="bench-compaction", shuffle=8)
    try:
        settings = load_analytics_settings(data_dir=data, analytics_output_dir=data / "out")
        ctx = JobContext(spark, StoreConf(sqlite=str(data)), settings, data / "out")
        t = time.monotonic()
        out = queue_compaction.run(ctx, argparse.Namespace(now_ms=now_ms, dry_run=False))
        return out, time.monotonic() - t
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--rows", type=int, default=10_000_000, help="entries for compaction (0: skip it)"
    )
    ap.add_argument("--scan-rows", type=int, default=2_000_000, help="entries for the scan")
    args = ap.parse_args(argv)
    now_ms = int(time.time() * 1000)
    lines = ["| analytics scenario | figure |", "|---|---|"]
    root = Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    try:
        scan = root / "scan"
        scan.mkdir()
        build_store(scan, args.scan_rows, now_ms)
        rates = {}
        for master in ("local[1]", "local[2]"):
            n, secs = scan_rate(scan, master)
            rates[master] = n / secs
            lines.append(f"| source scan, {n:,} rows, {master} | {n / secs:,.0f} rows/s |")
        lines.append(
            f"| scan speed-up 1 -> 2 cores | {rates['local[2]'] / rates['local[1]']:.2f}x |"
        )
        shutil.rmtree(scan)
        if not args.rows:
            return
        big = root / "compaction"
        big.mkdir()
        t = time.monotonic()
        expect = build_store(big, args.rows, now_ms)
        lines.append(
            f"| build {args.rows:,}-row store (executemany) | {time.monotonic() - t:.0f} s |"
        )
        out, wall = compaction(big, "local[2]", now_ms)
        removed = out["removed_total"]
        assert isinstance(removed, dict)
        for k, v in expect.items():
            if removed.get(k) != v:
                raise SystemExit(f"compaction removed {removed.get(k)} {k}, expected {v}")
        total = sum(removed.values())
        lines.append(
            f"| queue compaction of {args.rows:,} rows, local[2]: wall time | {wall:.0f} s |"
        )
        lines.append(f"| queue compaction: rows scanned per second | {args.rows / wall:,.0f} |")
        lines.append(f"| queue compaction: rows removed | {total:,} ({removed}) |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        print("\n".join(lines))


if __name__ == "__main__":
    main()
