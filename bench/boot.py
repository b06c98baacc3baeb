"""Router boot: from a routing snapshot versus a full scan or a full replay of the log.

`python -m bench.boot [subscriptions]` (default 1,000,000) fills an embedded store through the
store's own writes (so every subscription is also in the event log), then fills a route
table three ways, each in a fresh table, timing each: the scan of the subscriptions table
the router did before snapshots (one `add` per row), a replay of the whole event log from its
head, and the latest snapshot plus the log after its checkpoint (what the router does now,
services/router/boot.py). The compaction that wrote the snapshot is timed too. Each step is
timed as wall-clock and as CPU seconds of this process (the machine is shared; the ratios
use CPU). Prints a markdown table. Numbers are measurements, never assertions.
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

from services.common.route_table import RouteTable
from services.common.store.ports_session import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from services.router.boot import load_routes, replay, scan
from services.router.compaction import compact

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


Row = tuple[str, float, float, int]  # step, wall s, CPU s, subscriptions


async def _timed(name: str, fill: object) -> Row:
    table = RouteTable()
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    await fill(table)  # type: ignore[operator]
    return name, time.perf_counter() - started, time.process_time() - cpu, len(table)


async def run(n: int, folder: Path) -> list[Row]:
    store = SqliteSessionStore(folder / "sessions.db")
    try:
        subs = _subscriptions(n)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(0, n, BATCH):
            await store.put_subscriptions(subs[i : i + BATCH])
        fill = time.perf_counter() - started, time.process_time() - cpu
        del subs

        async def full_scan(table: RouteTable) -> None:
            await scan(store, table)

        async def full_replay(table: RouteTable) -> None:
            await replay(store, table, 0)

        async def snapshot(table: RouteTable) -> None:
            await load_routes(store, table)

        rows: list[Row] = [("fill the store (put_subscriptions, logged)", *fill, n)]
        rows.append(await _timed("boot: scan the subscriptions table", full_scan))
        rows.append(await _timed("boot: replay the event log from its head", full_replay))
        gc.collect()
        cpu = time.process_time()
        report = await compact(store, prune=False)
        cpu = time.process_time() - cpu
        rows.append(("compaction (in-process) writing the snapshot", report.seconds, cpu, n))
        rows.append(await _timed("boot: snapshot + log after the checkpoint", snapshot))
        return rows
    finally:
        await store.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(run(n, Path(tmp)))
    load = os.getloadavg()[0]
    print(f"Router boot with {n:,} subscriptions ({os.cpu_count()} cores; load {load:.1f})\n")
    print("| step | seconds | CPU seconds | subscriptions | CPU vs snapshot |")
    print("|---|---:|---:|---:|---:|")
    snap = rows[-1][2]
    for name, secs, cpu, count in rows:
        ratio = f"{cpu / snap:.1f}x" if name.startswith("boot") else ""
        print(f"| {name} | {secs:.2f} | {cpu:.2f} | {count:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
