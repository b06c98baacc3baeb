"""The operator's queue-store checks (services/common/store/cassandra_check.py) pass on the
model of Cassandra and on the embedded store, and report what they saw when a promise fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.store import cassandra_queue
from services.common.store.cassandra_check import check_queue_store
from services.common.store.sqlite_queue import SqliteQueueStore
from tests.simulation.standin import model_session, store_on

pytestmark = pytest.mark.simulation


async def test_the_checks_pass_on_the_model_and_on_sqlite(tmp_path: Path) -> None:
    for store in (
        store_on(model_session(3, cassandra_queue.MIGRATIONS)),
        SqliteQueueStore(tmp_path / "q.db"),
    ):
        results = await check_queue_store(store)
        assert [r.ok for r in results] == [True] * 4, results
        await store.close()


async def test_a_broken_promise_is_reported_with_what_was_seen() -> None:
    store = store_on(model_session(4, cassandra_queue.MIGRATIONS))

    async def forgetful_drop(tenant: str, queue_id: str) -> object:
        return None  # a drop that removes nothing

    store.drop = forgetful_drop  # type: ignore[method-assign]
    results = {r.name: r for r in await check_queue_store(store)}
    bad = results["a dropped queue is empty"]
    assert not bad.ok and "3 entries" in bad.detail
    assert all(r.ok for name, r in results.items() if name != "a dropped queue is empty")
