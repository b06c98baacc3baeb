"""Contract of `RouterStore` (retained and delayed messages), for every backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports import DelayedRecord, RetainedRecord, RouterStore
from services.common.store.sqlite_router import SqliteRouterStore

CASSANDRA = os.environ.get("STARLING_TEST_CASSANDRA", "")


@pytest.fixture(params=["sqlite", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RouterStore]:
    if request.param == "sqlite":
        s: RouterStore = SqliteRouterStore(tmp_path / "router.db")
    else:
        if not CASSANDRA:
            pytest.skip(
                "Cassandra contract run needs STARLING_TEST_CASSANDRA=host:port "
                "(no Docker engine here for testcontainers)"
            )
        from services.common.store.cassandra_router import CassandraRouterStore

        host, _, port = CASSANDRA.partition(":")
        s = CassandraRouterStore(
            [host], int(port or 9042), keyspace="starling_test", consistency="ONE"
        )
    yield s
    await s.close()


async def test_retained_put_replace_delete(store: RouterStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await store.put_retained(RetainedRecord(t, "a/b", b"1"))
    await store.put_retained(RetainedRecord(t, "a/b", b"2", 99))  # replaces
    await store.put_retained(RetainedRecord(t, "$SYS/x", b"3"))
    mine = sorted(
        (r.topic, r.data, r.expires_at_ms) for r in await store.all_retained() if r.tenant == t
    )
    assert mine == [("$SYS/x", b"3", 0), ("a/b", b"2", 99)]
    assert await store.delete_retained(t, "a/b") is True
    assert await store.delete_retained(t, "a/b") is False
    assert [r.topic for r in await store.all_retained() if r.tenant == t] == ["$SYS/x"]


async def test_delayed_in_due_order_and_cancel(store: RouterStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await store.put_delayed(DelayedRecord("late", t, 2_000, b"L"))
    await store.put_delayed(DelayedRecord("soon", t, 1_000, b"S"))
    mine = [r for r in await store.all_delayed() if r.tenant == t]
    assert [(r.id, r.due_ms, r.data) for r in mine] == [
        ("soon", 1_000, b"S"),
        ("late", 2_000, b"L"),
    ]
    assert await store.delete_delayed(t, "soon") is True
    assert await store.delete_delayed(t, "soon") is False
    assert [r.id for r in await store.all_delayed() if r.tenant == t] == ["late"]


async def test_survives_reopen(tmp_path: Path) -> None:
    s = SqliteRouterStore(tmp_path / "r.db")
    await s.put_retained(RetainedRecord("t", "a", b"x"))
    await s.put_delayed(DelayedRecord("d", "t", 5, b"y"))
    await s.close()
    s2 = SqliteRouterStore(tmp_path / "r.db")
    assert [r.topic for r in await s2.all_retained()] == ["a"]
    assert [r.id for r in await s2.all_delayed()] == ["d"]
    await s2.close()
