"""One contract for every store backend: the embedded SQLite store here, Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster (skipped, with that reason,
otherwise: Cassandra cannot run on machines without Docker)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.acl import Access, AclRule
from services.common.store.ports_auth import AuthStore, UserRecord
from services.common.store.sqlite import SqliteStore
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AuthStore]:
    if request.param == "sqlite":
        s: AuthStore = SqliteStore(tmp_path / "store.db")
    else:
        t = cassandra_target()
        from services.common.store.cassandra import CassandraStore

        s = CassandraStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


async def test_users(store: AuthStore) -> None:
    tenant = f"t{uuid.uuid4().hex[:6]}"
    assert await store.get_user(tenant, "u") is None
    await store.put_user(UserRecord(tenant, "u", "$argon2id$x"))
    await store.put_user(UserRecord(tenant, "u", "$argon2id$y"))  # replace
    assert await store.get_user(tenant, "u") == UserRecord(tenant, "u", "$argon2id$y")
    assert await store.get_user("other", "u") is None
    assert await store.delete_user(tenant, "u") is True
    assert await store.delete_user(tenant, "u") is False
    assert await store.get_user(tenant, "u") is None


async def test_acl_replaced_in_order(store: AuthStore) -> None:
    tenant = f"t{uuid.uuid4().hex[:6]}"
    assert await store.get_acl(tenant) == []
    first = [AclRule(True, Access.PUBLISH, f"a/{i}", "u", "") for i in range(12)]
    await store.set_acl(tenant, first)
    assert await store.get_acl(tenant) == first
    second = [AclRule(False, Access.ALL, "#", "", "c1")]
    await store.set_acl(tenant, second)
    assert await store.get_acl(tenant) == second


async def test_survives_reopen(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "db")
    await s.put_user(UserRecord("t", "u", "h"))
    await s.close()
    s2 = SqliteStore(tmp_path / "db")
    assert await s2.get_user("t", "u") == UserRecord("t", "u", "h")
    await s2.close()
