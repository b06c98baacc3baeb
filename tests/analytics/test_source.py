"""Format `starling` over stores written by the real store classes: every table readable with
its schema, bytes intact, each row read exactly once across the key-range partitions, tenant
and time filters pushed down and still correct; the Cassandra path against a real cluster when
STARLING_TEST_CASSANDRA names one."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from analytics.source import (
    TABLE_FILES,
    StoreConf,
    default_partitions,
    read,
    split_range,
    sqlite_file,
    token_ranges,
)
from services.common.store.ports_queue import NewQueueItem
from services.common.store.ports_session import SessionRecord, SubscriptionRecord
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.sqlite_router import SqliteRouterStore
from services.common.store.sqlite_session import SqliteSessionStore
from services.common.store.sqlite_tokens import SqliteTokenStore

CASSANDRA = os.environ.get("STARLING_TEST_CASSANDRA", "")
TENANTS = ["acme", "blue", "cyan"]
PER_QUEUE = 40


async def _fill(data: Path) -> dict[str, int]:
    """Queues of three tenants through the real queue store; one session, subscription and
    retained message each. Returns the expected row counts."""
    q = SqliteQueueStore(data / "queues.db")
    epoch = await q.claim_partition(0)
    now = int(time.time() * 1000)
    for t in TENANTS:
        for c in range(3):
            items = [
                NewQueueItem(
                    f"{t}-{c}-{i}", 1, bytes([i % 256]) * (i + 1), now + i * 1000 if i % 2 else 0
                )
                for i in range(PER_QUEUE)
            ]
            await q.append(t, f"c{c}#1", items, 0, epoch, 0, False)
    await q.close()
    s = SqliteSessionStore(data / "sessions.db")
    r = SqliteRouterStore(data / "router.db")
    for t in TENANTS:
        await s.put_session(SessionRecord(t, "c0", 1, 60, False, now))
        await s.put_subscriptions([SubscriptionRecord(t, "c0", 1, "a/#", 1)])
    await s.close()
    await r.close()
    tokens = SqliteTokenStore(data / "admin_tokens.db")
    await tokens.close()
    return {"queue_entries": len(TENANTS) * 3 * PER_QUEUE, "sessions": len(TENANTS)}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[StoreConf, dict[str, int]]:
    data = tmp_path_factory.mktemp("store")
    counts = asyncio.run(_fill(data))
    return StoreConf(sqlite=str(data)), counts


def test_queue_entries_read_whole_and_exactly_once(
    spark: SparkSession, store: tuple[StoreConf, dict[str, int]]
) -> None:
    conf, counts = store
    df = read(spark, conf, "queue_entries")
    assert df.rdd.getNumPartitions() >= default_partitions(spark.sparkContext.defaultParallelism)
    dtypes = dict(df.dtypes)
    assert dtypes["data"] == "binary" and dtypes["seq"] == "bigint" and dtypes["tenant"] == "string"
    rows = df.select("tenant", "queue_id", "seq", "data").collect()
    assert len(rows) == counts["queue_entries"]
    keys = {(r.tenant, r.queue_id, r.seq) for r in rows}
    assert len(keys) == len(rows)  # no row read twice by overlapping ranges
    for r in rows:  # seq i+1 holds i+1 bytes of value i: blobs arrive byte for byte
        assert r.data == bytes([(r.seq - 1) % 256]) * r.seq


def test_every_store_table_has_a_schema(
    spark: SparkSession, store: tuple[StoreConf, dict[str, int]]
) -> None:
    conf, counts = store
    made = [t for t in TABLE_FILES if (Path(conf.sqlite or "") / TABLE_FILES[t]).exists()]
    assert {"queue_entries", "queue_state", "queue_msgids", "sessions", "subscriptions"} <= set(
        made
    )
    for table in made:
        df = read(spark, conf, table)
        assert df.columns, table
    assert read(spark, conf, "sessions").count() == counts["sessions"]
    assert read(spark, conf, "retained").count() == 0  # an empty table reads as empty


def test_format_options_take_a_store_file_directly(
    spark: SparkSession, store: tuple[StoreConf, dict[str, int]]
) -> None:
    conf, counts = store
    path = sqlite_file(conf.sqlite or "", "queue_entries")
    df = (
        spark.read.format("starling")
        .option("table", "queue_entries")
        .option("sqlite", str(path))
        .load()
    )
    assert df.count() == counts["queue_entries"]


def _plan(df: object) -> str:
    return df._jdf.queryExecution().executedPlan().toString()  # type: ignore[attr-defined]


def test_tenant_and_time_filters_are_pushed_and_correct(
    spark: SparkSession, store: tuple[StoreConf, dict[str, int]]
) -> None:
    conf, _ = store
    df = read(spark, conf, "queue_entries")
    cut = int(time.time() * 1000) + 10_000
    one = df.where("tenant = 'blue' AND expires_at_ms >= 1 AND expires_at_ms < " + str(cut))
    two = df.where("tenant IN ('acme', 'cyan')")
    # Pushed filters leave no comparison on those columns for Spark to evaluate.
    assert "blue" not in _plan(one) and "acme" not in _plan(two)
    rows = one.select("tenant", "expires_at_ms").collect()
    assert rows and all(r.tenant == "blue" and 1 <= r.expires_at_ms < cut for r in rows)
    # Same answer as Spark filtering everything itself.
    every = df.select("tenant", "expires_at_ms").collect()
    assert len(rows) == sum(1 for r in every if r.tenant == "blue" and 1 <= r.expires_at_ms < cut)
    assert two.count() == 2 * 3 * PER_QUEUE
    # A filter the source does not handle is left to Spark, and still applied.
    assert df.where("qos = 2").count() == 0


def test_bad_options_are_refused(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="table"):
        spark.read.format("starling").option("sqlite", str(tmp_path)).load()
    with pytest.raises(Exception, match="no store file"):
        spark.read.format("starling").option("table", "nope").option("sqlite", str(tmp_path)).load()


def test_ranges_cover_everything_once() -> None:
    assert split_range(5, 5, 4) == []
    assert split_range(0, 3, 8) == [(0, 1), (1, 2), (2, 3)]
    pieces = split_range(-7, 1000, 9)
    assert pieces[0][0] == -7 and pieces[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
    ranges = token_ranges(7)
    assert ranges[0].lo == -(2**63) and ranges[0].first and ranges[-1].hi == 2**63 - 1
    assert all(a.hi == b.lo and not b.first for a, b in itertools.pairwise(ranges))


@pytest.mark.cassandra
def test_cassandra_source_reads_token_ranges(spark: SparkSession) -> None:
    if not CASSANDRA:
        pytest.skip(
            "Cassandra source run needs STARLING_TEST_CASSANDRA=host:port "
            "(no Docker engine here for testcontainers)"
        )
    from services.common.store.cassandra_queue import CassandraQueueStore

    host, _, port = CASSANDRA.partition(":")
    tenant = f"t{uuid.uuid4().hex[:8]}"

    async def fill() -> None:
        q = CassandraQueueStore(
            contact_points=[host],
            port=int(port or 9042),
            keyspace="starling_test",
            consistency="ONE",
        )
        epoch = await q.claim_partition(7)
        for c in range(20):
            items = [NewQueueItem(f"m{c}-{i}", 1, b"x" * i, 0) for i in range(25)]
            await q.append(tenant, f"c{c}#1", items, 7, epoch, 0, False)
        await q.close()

    asyncio.run(fill())
    conf = StoreConf(cassandra=(host,), port=int(port or 9042), keyspace="starling_test")
    df = read(spark, conf, "queue_entries").where(f"tenant = '{tenant}'")
    rows = df.select("queue_id", "seq", "data").collect()
    assert len(rows) == 20 * 25
    assert len({(r.queue_id, r.seq) for r in rows}) == len(rows)
    assert all(r.data == b"x" * (r.seq - 1) for r in rows)
