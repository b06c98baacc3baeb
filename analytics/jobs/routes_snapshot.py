"""`routes-snapshot`: event-log compaction on Spark. Every subscription, read through the
`starling` data source (analytics/source.py) from the embedded store or Cassandra, grouped by
tenant and encoded into the routing snapshot format (services/router/snapshot.py) in the
executors; the driver stores the parts with their checkpoint and then prunes the log up to
it (EventLog.prune_events: the embedded store exactly, Cassandra whole hours), raising each
tenant's pruned-through watermark before its events go, so a running router whose position
is behind the prune reloads that tenant from this snapshot instead of missing the pruned
changes. Routers and connection nodes boot from the result (services/router/boot.py).

Checkpoint: the log's stable position taken BEFORE the scan starts. Every change at or
below it is in the rows the scan reads; changes that land during the scan may be in them too,
and a boot replays every change above the checkpoint, which sets those rows again (a logged
change carries its row's whole state), so snapshot + replay is the subscriptions table.

Idempotent and restartable: the store writes a snapshot's manifest after its parts, so a
job that dies anywhere leaves the previous snapshot in force; running it again takes a fresh
one. Pruning only follows a stored manifest.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from analytics.source import StoreConf, read, store_conf_from_settings

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from analytics.config import AnalyticsSettings
    from services.common.store.eventlog import LoggedSessionStore

NAME = "routes-snapshot"
PART_SCHEMA = "tenant string, subscriptions long, part int, data binary"
_COLUMNS = (
    "tenant",
    "client_id",
    "incarnation",
    "topic_filter",
    "qos",
    "no_local",
    "retain_as_published",
    "retain_handling",
    "subscription_identifier",
)


def encode_group(table: pa.Table) -> pa.Table:
    """One tenant's subscriptions (an Arrow table, in an executor) as its snapshot parts."""
    import pyarrow as pa

    from services.common.route_table import RouteTable
    from services.common.store.ports_session import SubscriptionRecord
    from services.router.snapshot import encode_tenant

    cols = [table.column(c).to_pylist() for c in _COLUMNS]
    routes = RouteTable()
    for t, c, i, f, q, nl, rap, rh, sid in zip(*cols, strict=True):
        routes.add(
            SubscriptionRecord(t, c, int(i), f, int(q), bool(nl), bool(rap), int(rh), int(sid))
        )
    tenant = cols[0][0] if cols[0] else ""
    count, parts = encode_tenant(routes, tenant) if cols[0] else (0, [])
    return pa.Table.from_pydict(
        {
            "tenant": [tenant] * len(parts),
            "subscriptions": [count] * len(parts),
            "part": list(range(len(parts))),
            "data": parts,
        },
        schema=pa.schema(
            [
                ("tenant", pa.string()),
                ("subscriptions", pa.int64()),
                ("part", pa.int32()),
                ("data", pa.binary()),
            ]
        ),
    )


def snapshot_parts(
    spark: SparkSession, conf: StoreConf, partitions: int | None = None
) -> dict[str, tuple[int, list[bytes]]]:
    """Every tenant's snapshot parts, encoded by the executors."""
    subs = read(spark, conf, "subscriptions", partitions).select(*_COLUMNS)
    rows = subs.groupBy("tenant").applyInArrow(encode_group, PART_SCHEMA).collect()
    out: dict[str, tuple[int, list[bytes]]] = {}
    for r in sorted(rows, key=lambda r: (r.tenant, r.part)):
        out.setdefault(r.tenant, (r.subscriptions, []))[1].append(bytes(r.data))
    return out


async def compact_with_spark(
    spark: SparkSession,
    store: LoggedSessionStore,
    conf: StoreConf,
    partitions: int | None = None,
    prune: bool = True,
) -> dict[str, Any]:
    """Take a snapshot of `store` through Spark; what it did."""
    from services.router.compaction import write_snapshot

    started = time.perf_counter()
    checkpoint = await store.stable_position()  # before the scan: see the module docstring
    parts = await asyncio.to_thread(snapshot_parts, spark, conf, partitions)
    manifest, pruned = await write_snapshot(store, checkpoint, parts, prune)
    return {
        "job": NAME,
        "snapshot_id": manifest.snapshot_id,
        "checkpoint": manifest.checkpoint,
        "tenants": len(manifest.tenants),
        "subscriptions": manifest.subscriptions,
        "pruned": pruned,
        "seconds": round(time.perf_counter() - started, 3),
    }


def run(spark: SparkSession, settings: AnalyticsSettings) -> dict[str, Any]:
    """The job as `starling analytics routes-snapshot` runs it."""
    from services.common.store.open import open_session_store

    async def go() -> dict[str, Any]:
        store = open_session_store(settings)
        try:
            partitions = settings.analytics_partitions or None
            return await compact_with_spark(
                spark, store, store_conf_from_settings(settings), partitions
            )
        finally:
            await store.close()

    return asyncio.run(go())
