"""The tenant report and queue compaction against a real Cassandra cluster, written through
the real Cassandra stores: run with STARLING_TEST_CASSANDRA=host:port, skipped (saying why)
otherwise. Here, without a server, test_job_columns.py checks the same jobs against the
parsed schema."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from analytics.config import load_analytics_settings
from analytics.jobs import queue_compaction, tenant_report
from analytics.jobs.context import JobContext
from analytics.source import StoreConf
from services.common.store.ports_queue import NewQueueItem
from services.common.store.ports_router import RetainedRecord
from services.common.store.ports_session import SessionRecord
from services.common.store.ports_usage import UsageDelta
from tests.common.cassandra_target import CassandraTarget, cassandra_target

pytestmark = pytest.mark.cassandra
H = 3_600_000
NOW = int(time.time() * 1000)


def _ctx(spark: SparkSession, where: CassandraTarget, out: Path) -> JobContext:
    settings = load_analytics_settings(analytics_output_dir=out, analytics_partitions=5)
    store = StoreConf(
        cassandra=tuple(where.contact_points), port=where.port, keyspace=where.keyspace
    )
    return JobContext(spark, store, settings, out)


def _kw(where: CassandraTarget) -> dict[str, Any]:
    return {"port": where.port, "keyspace": where.keyspace, "consistency": "LOCAL_QUORUM"}


@pytest.fixture
def where() -> CassandraTarget:
    """The cluster (skips before Spark starts when there is none)."""
    return cassandra_target()


def test_tenant_report_sums_usage_and_peaks(
    where: CassandraTarget, spark: SparkSession, tmp_path: Path
) -> None:
    from services.common.store.cassandra_usage import CassandraUsageStore

    tenant = f"rep{uuid.uuid4().hex[:8]}"
    hour = NOW // H * H

    async def fill() -> None:
        s = CassandraUsageStore(contact_points=where.contact_points, **_kw(where))
        await s.add([UsageDelta(tenant, hour, "n1", 3, 60_000, 5, 4, 0, bytes_in=50)])
        await s.add([UsageDelta(tenant, hour, "n2", 2, 60_000, 1, 1, 0, bytes_in=10)])
        await s.close()

    asyncio.run(fill())
    ctx = _ctx(spark, where, tmp_path)
    args = argparse.Namespace(since_ms=hour, until_ms=0, tenant=[tenant])
    (row,) = [r.asDict() for r in tenant_report.hourly(ctx, args).collect()]
    assert (row["connections_peak"], row["connection_minutes"]) == (5, 2.0)
    assert (row["messages_in"], row["bytes_in"]) == (6, 60)


def test_queue_compaction_drops_a_dead_sessions_queue_only(
    where: CassandraTarget, spark: SparkSession, tmp_path: Path
) -> None:
    from services.common.store.cassandra_queue import CassandraQueueStore
    from services.common.store.cassandra_router import CassandraRouterStore
    from services.common.store.cassandra_session import CassandraSessionStore

    tenant = f"cmp{uuid.uuid4().hex[:8]}"

    async def fill() -> None:
        q = CassandraQueueStore(contact_points=where.contact_points, **_kw(where))
        epoch = await q.claim_partition(3)
        for cid in ("dead", "live"):
            items = [NewQueueItem(f"{cid}-{i}", 1, b"m", 0) for i in range(4)]
            await q.append(tenant, f"{cid}#1", items, 3, epoch, 0, False)
        await q.close()
        s = CassandraSessionStore(contact_points=where.contact_points, **_kw(where))
        await s.put_session(SessionRecord(tenant, "dead", 1, 10, False, NOW - H))
        await s.put_session(SessionRecord(tenant, "live", 1, 3600, False, NOW))
        await s.close()
        r = CassandraRouterStore(contact_points=where.contact_points, **_kw(where))
        await r.put_retained(RetainedRecord(tenant, "old", b"x", NOW - 60_000))
        await r.put_retained(RetainedRecord(tenant, "new", b"x", NOW + H))
        await r.close()

    asyncio.run(fill())
    out = queue_compaction.run(_ctx(spark, where, tmp_path), argparse.Namespace(now_ms=NOW))
    mine = out["by_tenant"][tenant]
    assert (mine["session_queues"], mine["retained"]) == (4, 1)

    async def left() -> tuple[int, list[str]]:
        q = CassandraQueueStore(contact_points=where.contact_points, **_kw(where))
        r = CassandraRouterStore(contact_points=where.contact_points, **_kw(where))
        try:
            live = await q.read(tenant, "live#1", 0, 100)
            kept = [x.topic for x in await r.tenant_retained(tenant)]
        finally:
            await q.close()
            await r.close()
        return len(live), kept

    assert asyncio.run(left()) == (4, ["new"])
