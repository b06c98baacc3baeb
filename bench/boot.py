"""Router boot: from a routing snapshot versus a full scan or a full replay of the log.

`python -m bench.boot [subscriptions]` (default 1,000,000) fills an embedded store through the
store's own writes (so every subscription is also in the event log), then fills a route
table three ways, each in a fresh table, timing each: the scan of the subscriptions table
the router did before snapshots (one `add` per row), a replay of the whole event log from its
head, and the latest snapshot plus the log after its checkpoint (what the router does now,
services/router/boot.py). The compaction that wrote the snapshot is timed too. Prints a
markdown table. Numbers are measurements, never assertions.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from services.common.store.ports import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from services.router.boot import load_routes, replay
from services.router.compaction import compact
from services.router.core import RouteTable

TENANTS = 20
FILTERS_PER_SESSION = 4
BATCH = 5_000  # subscriptions per store write while filling


def _subscriptions(n: int) -> list[SubscriptionRecord]:
    """A fleet: each session subscribes to its own command topics and a few shared ones."""
    rng = random.Random(1)
    out = []
    for i in range(n):
        session, k = divmod(i, FILTERS_PER_SESSION)
        tenant = f"tenant-{session % TENANTS}"
        filt = (
            f"fleet/{session}/cmd/{k}"
            if k < FILTERS_PER_SESSION - 1
            else f"fleet/+/broadcast/{rng.randrange(50)}"
        )
        out.append(SubscriptionRecord(tenant, f"device-{session}", 1, filt, 1 + (k == 0)))
    return out


async def _timed(fill: object) -> tuple[float, int]:
    table = RouteTable()
    gc.collect()
    started = time.perf_counter()
    await fill(table)  # type: ignore[operator]
    return time.perf_counter() - started, len(table)


async def run(n: int, folder: Path) -> list[tuple[str, float, int]]:
    store = SqliteSessionStore(folder / "sessions.db")
    try:
        subs = _subscriptions(n)
        started = time.perf_counter()
        for i in range(0, n, BATCH):
            await store.put_subscriptions(subs[i : i + BATCH])
        fill_s = time.perf_counter() - started
        del subs

        async def scan(table: RouteTable) -> None:
            for rec in await store.all_subscriptions():
                table.add(rec)

        async def full_replay(table: RouteTable) -> None:
            await replay(store, table, 0)

        async def snapshot(table: RouteTable) -> None:
            await load_routes(store, table)

        rows = [("fill the store (put_subscriptions, logged)", fill_s, n)]
        rows.append(("boot: scan the subscriptions table", *await _timed(scan)))
        rows.append(("boot: replay the event log from its head", *await _timed(full_replay)))
        gc.collect()
        report = await compact(store, prune=False)
        rows.append(("compaction (in-process) writing the snapshot", report.seconds, n))
        rows.append(("boot: snapshot + log after the checkpoint", *await _timed(snapshot)))
        return rows
    finally:
        await store.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run(n, Path(tmp)))
    load = os.getloadavg()[0]
    print(f"Router boot with {n:,} subscriptions ({os.cpu_count()} cores; load {load:.1f})\n")
    print("| step | seconds | subscriptions | vs snapshot |")
    print("|---|---:|---:|---:|")
    snap = rows[-1][1]
    for name, secs, count in rows:
        ratio = f"{secs / snap:.1f}x" if name.startswith("boot") else ""
        print(f"| {name} | {secs:.2f} | {count:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
