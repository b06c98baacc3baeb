"""Routing snapshot compaction in one process: every subscription as of a log position,
encoded per tenant (services/router/snapshot.py), stored with that position as its
checkpoint, then the log's hours wholly before it pruned. The `routes-snapshot` Spark job
(analytics/jobs/routes_snapshot.py) writes the same snapshots from a cluster; this is what it
falls back on, and what tests and the boot benchmark use.

Idempotent and restartable: a run that dies before the store wrote the manifest leaves the
previous snapshot in force (EventLog.put_snapshot), and running again just takes a newer one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from services.common.route_table import RouteTable
from services.common.store.eventlog import LoggedSessionStore, SnapshotManifest
from services.common.store.ports_session import SubscriptionRecord
from services.router.snapshot import encode_tenant


@dataclass(frozen=True, slots=True)
class CompactionReport:
    manifest: SnapshotManifest
    pruned: int  # log rows (Cassandra: partitions) removed
    seconds: float


def encode_all(subs: Iterable[SubscriptionRecord]) -> dict[str, tuple[int, list[bytes]]]:
    """Every tenant's snapshot parts for these subscriptions."""
    table = RouteTable()
    for rec in subs:
        table.add(rec)
    return {t: encode_tenant(table, t) for t in table.tenants()}


async def write_snapshot(
    store: LoggedSessionStore,
    checkpoint: int,
    parts: dict[str, tuple[int, list[bytes]]],
    prune: bool = True,
) -> tuple[SnapshotManifest, int]:
    """Store the snapshot, then prune the log's hours it makes unnecessary."""
    manifest = await store.put_snapshot(checkpoint, parts)
    pruned = await store.prune_events(checkpoint) if prune else 0
    return manifest, pruned


async def compact(store: LoggedSessionStore, prune: bool = True) -> CompactionReport:
    started = time.perf_counter()
    position, subs = await store.subscriptions_as_of()
    manifest, pruned = await write_snapshot(store, position, encode_all(subs), prune)
    return CompactionReport(manifest, pruned, time.perf_counter() - started)
