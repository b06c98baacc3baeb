"""The `AdminTokenStore` contract: the embedded SQLite store, and Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster (skipped otherwise)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports_auth import AdminTokenRecord, AdminTokenStore
from services.common.store.sqlite_tokens import SqliteTokenStore
from tests.common.cassandra_model import on_model
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AdminTokenStore]:
    if request.param == "sqlite":
        s: AdminTokenStore = SqliteTokenStore(tmp_path / "tokens.db")
    elif request.param == "model":  # the Cassandra store on the simulator's model
        from services.common.store.cassandra_tokens import CassandraTokenStore

        s = on_model(CassandraTokenStore)
    else:
        t = cassandra_target()
        from services.common.store.cassandra_tokens import CassandraTokenStore

        s = CassandraTokenStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


async def test_put_get_list_delete(store: AdminTokenStore) -> None:
    acme, other = f"acme{uuid.uuid4().hex[:6]}", f"other{uuid.uuid4().hex[:6]}"
    ids = [uuid.uuid4().hex[:12] for _ in range(3)]
    a1 = AdminTokenRecord(ids[0], acme, "h1", 1000, 5000, "ops")
    a2 = AdminTokenRecord(ids[1], acme, "h2", 2000, 0)
    o1 = AdminTokenRecord(ids[2], other, "h3", 1500, 9000)
    for r in (a2, o1, a1):
        await store.put_token(r)
    assert await store.get_token(ids[0]) == a1
    assert await store.get_token("000000000000") is None
    assert await store.list_tokens(acme) == [a1, a2]  # by creation
    everyone = [r for r in await store.list_tokens() if r.tenant in (acme, other)]
    assert everyone == [a1, o1, a2]
    assert await store.delete_token(ids[0]) is True
    assert await store.delete_token(ids[0]) is False
    assert await store.get_token(ids[0]) is None
    assert await store.list_tokens(acme) == [a2]


def test_expiry() -> None:
    r = AdminTokenRecord("x", "t", "h", 0, 5000)
    assert not r.expired(4999) and r.expired(5000)
    assert not AdminTokenRecord("y", "t", "h", 0, 0).expired(10**15)  # 0: never
