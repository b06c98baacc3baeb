"""The queue stores the `QueueStore` contract runs against (tests/common/test_store_contract_queue
*.py): the embedded SQLite store, Cassandra (STARLING_TEST_CASSANDRA, else skipped) and the
Cassandra store on the model of tests/simulation; and the items the tests append."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common.store.ports_queue import NewQueueItem, QueueStore
from services.common.store.sqlite_queue import SqliteQueueStore
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


def second_store(queues: QueueStore, tmp_path: Path) -> Any:
    """Another instance on the same store (a second connection)."""
    if isinstance(queues, SqliteQueueStore):
        return SqliteQueueStore(tmp_path / "q.db")
    session = getattr(queues, "_session", None)
    if type(session).__name__ == "SimSession":
        from tests.simulation.standin import store_on

        return store_on(session)
    return cassandra_store("queue")


@pytest.fixture(params=["sqlite", "cassandra", "model"])
async def queues(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QueueStore]:
    if request.param == "sqlite":
        q: Any = SqliteQueueStore(tmp_path / "q.db")
    elif request.param == "model":
        q = model_queues()
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
