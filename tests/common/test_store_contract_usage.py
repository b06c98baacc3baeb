"""The `UsageStore` contract: the embedded SQLite store, and Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster (skipped otherwise). Plus the
embedded store opening a file written before the per-QoS columns existed."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store import cassandra_usage
from services.common.store.cassandra_schema import check_migrations
from services.common.store.ports_usage import TopicDelta, UsageDelta, UsageStore
from services.common.store.sqlite_usage import SqliteUsageStore
from tests.common.cassandra_target import cassandra_target

H = 3_600_000


@pytest.fixture(params=["sqlite", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[UsageStore]:
    if request.param == "sqlite":
        s: UsageStore = SqliteUsageStore(tmp_path / "usage.db")
    else:
        t = cassandra_target()
        s = cassandra_usage.CassandraUsageStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


def delta(tenant: str, conns: int, n: int, node: str = "n1", hour: int = H) -> UsageDelta:
    return UsageDelta(
        tenant, hour, node, conns, 10 * n, n, 2 * n, 1, msgs_in_q0=n, msgs_out_q1=2 * n,
        bytes_in=100 * n, bytes_out=200 * n, quota_refusals=3,
    )  # fmt: skip


async def test_deltas_add_up_and_connections_keep_the_hour_peak(store: UsageStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await store.add([delta(t, 5, 1), delta(t, 1, 1, node="n2")])
    await store.add([delta(t, 3, 2), delta(t, 0, 1, hour=2 * H)])
    rows = await store.usage(t)
    assert rows == [
        UsageDelta(
            t, H, "n1", 5, 30, 3, 6, 2, msgs_in_q0=3, msgs_out_q1=6, bytes_in=300,
            bytes_out=600, quota_refusals=6,
        ),
        delta(t, 1, 1, node="n2"),
        delta(t, 0, 1, hour=2 * H),
    ]  # fmt: skip
    assert await store.usage("nobody") == []


async def test_top_topics_add_up_per_hour(store: UsageStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await store.add([], [TopicDelta(t, H, "a/b", 8), TopicDelta(t, H, "c", 16)])
    await store.add([], [TopicDelta(t, H, "a/b", 8), TopicDelta(t, 2 * H, "a/b", 1)])
    assert await store.topics(t) == [
        TopicDelta(t, H, "a/b", 16),
        TopicDelta(t, H, "c", 16),
        TopicDelta(t, 2 * H, "a/b", 1),
    ]


def test_cassandra_migrations_are_numbered() -> None:
    check_migrations(cassandra_usage.MIGRATIONS)


async def test_an_old_file_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    db = sqlite3.connect(path)
    db.executescript(
        """CREATE TABLE usage (
          tenant TEXT NOT NULL, hour_ms INTEGER NOT NULL, node_id TEXT NOT NULL,
          connections_max INTEGER NOT NULL, connection_ms INTEGER NOT NULL,
          messages_in INTEGER NOT NULL, messages_out INTEGER NOT NULL, dropped INTEGER NOT NULL,
          PRIMARY KEY (tenant, hour_ms, node_id));
        INSERT INTO usage VALUES ('a', 3600000, 'n1', 2, 5, 7, 9, 1);"""
    )
    db.close()
    store = SqliteUsageStore(path)
    await store.add([delta("a", 1, 1)])
    (row,) = await store.usage("a")
    assert (row.messages_in, row.msgs_in_q0, row.bytes_in, row.connections) == (8, 1, 100, 2)
    await store.close()
