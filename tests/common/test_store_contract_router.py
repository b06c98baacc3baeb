"""Contract of `RouterStore` (retained and delayed messages), for every backend."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports_router import DelayedRecord, RetainedRecord, RouterStore
from services.common.store.sqlite_router import SqliteRouterStore
from tests.common.cassandra_model import on_model
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RouterStore]:
    if request.param == "sqlite":
        s: RouterStore = SqliteRouterStore(tmp_path / "router.db")
    elif request.param == "model":  # the Cassandra store on the simulator's model
        from services.common.store.cassandra_router import CassandraRouterStore

        s = on_model(CassandraRouterStore)
    else:
        t = cassandra_target()
        from services.common.store.cassandra_router import CassandraRouterStore

        s = CassandraRouterStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
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
