"""The queue stores the `QueueStore` contract runs against (tests/common/test_store_contract_queue
*.py): the embedded SQLite store, Cassandra (STARLING_TEST_CASSANDRA, else skipped), the
Cassandra store on the model of tests/simulation and Redis Streams (the session's
redis-server, a key prefix of its own per test); and the items the tests append."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from services.common.store.ports_queue import NewQueueItem, QueueStore
from services.common.store.redis_queue import RedisQueueStore
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.tenant_queues import TenantQueueStores
from tests.common.cassandra_target import cassandra_target


def cassandra_store(kind: str) -> Any:
    """The Cassandra queue store (`kind` "queue") or session store (any other)."""
    t = cassandra_target()
    from services.common.store.cassandra_queue import CassandraQueueStore
    from services.common.store.cassandra_session import CassandraSessionStore

    cls = CassandraQueueStore if kind == "queue" else CassandraSessionStore
    return cls(t.contact_points, t.port, keyspace=t.keyspace, consistency=t.consistency)


def model_queues() -> Any:
    """The Cassandra queue store on the model of tests/simulation (a healthy cluster)."""
    from services.common.store import cassandra_queue
    from tests.simulation.standin import model_session, store_on

    return store_on(model_session(0, cassandra_queue.MIGRATIONS))


def redis_queues(redis_url: str, key_prefix: str) -> RedisQueueStore:
    """A Redis Streams queue store on `redis_url`, its keys under `key_prefix`."""
    return RedisQueueStore(redis=Redis.from_url(redis_url), key_prefix=key_prefix)


def _second_client(redis: Any) -> Any:
    """Another client of the Redis (or Redis Cluster) `redis` talks to."""
    if isinstance(redis, RedisCluster):
        nodes = [ClusterNode(n.host, n.port) for n in redis.get_nodes()]
        return RedisCluster(startup_nodes=nodes, password=redis.get_connection_kwargs()["password"])
    kw = redis.get_connection_kwargs()
    return Redis(host=kw["host"], port=kw["port"], password=kw["password"], db=kw["db"])


def second_store(queues: QueueStore, tmp_path: Path) -> Any:
    """Another instance on the same store (a second connection)."""
    if isinstance(queues, SqliteQueueStore):
        return SqliteQueueStore(tmp_path / "q.db")
    if isinstance(queues, TenantQueueStores):
        stores = {k: second_store(v, tmp_path) for k, v in queues._stores.items()}
        return TenantQueueStores(stores=stores, by_tenant={}, default_kind=queues._default)
    if isinstance(queues, RedisQueueStore):
        return RedisQueueStore(redis=_second_client(queues._r), key_prefix=queues._prefix)
    session = getattr(queues, "_session", None)
    if type(session).__name__ == "SimSession":
        from tests.simulation.standin import store_on

        return store_on(session)
    return cassandra_store("queue")


def tenant_queues(redis_url: str, tmp_path: Path) -> TenantQueueStores:
    """The per-tenant dispatcher over SQLite and Redis, every tenant on Redis by default (its
    epochs translated from the SQLite store's; tests/common/test_tenant_queues.py puts
    tenants on each)."""
    stores: dict[str, QueueStore] = {
        "store": SqliteQueueStore(tmp_path / "q.db"),
        "redis": redis_queues(redis_url, f"tq{uuid.uuid4().hex[:8]}:"),
    }
    return TenantQueueStores(stores=stores, by_tenant={}, default_kind="redis")


@pytest.fixture(params=["sqlite", "cassandra", "model", "redis", "tenants"])
async def queues(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QueueStore]:
    if request.param == "sqlite":
        q: Any = SqliteQueueStore(tmp_path / "q.db")
    elif request.param == "model":
        q = model_queues()
    elif request.param == "redis":
        q = redis_queues(request.getfixturevalue("redis_url"), f"tq{uuid.uuid4().hex[:8]}:")
    elif request.param == "tenants":
        q = tenant_queues(request.getfixturevalue("redis_url"), tmp_path)
    else:
        q = cassandra_store("queue")
    yield q
    await q.close()


def items(n: int, start: int = 0, prefix: str = "m") -> list[NewQueueItem]:
    return [
        NewQueueItem(f"{prefix}{i}", 1, f"payload-{i}".encode()) for i in range(start, start + n)
    ]


def named(n: int, start: int, prefix: str) -> list[NewQueueItem]:
    """Items whose payload is their message id (tells which writer's message is stored)."""
    return [
        NewQueueItem(f"{prefix}{i}", 1, f"{prefix}{i}".encode()) for i in range(start, start + n)
    ]


async def all_entries(queues: QueueStore, t: str, q: str) -> list[Any]:
    entries, _ = await queues.read(t, q, 1, 10_000)
    return entries
