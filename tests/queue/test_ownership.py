"""Partition ownership among queue instances (services/queue/ownership.py and leases.py)
against a real Redis and one SQLite file: a joining instance gets its share, a silent one's
partitions move after its lease, and the instance that lost a partition can no longer write
to it (its epoch is refused by the store)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from services.common.store.ports_queue import AppendOutcome, NewQueueItem
from services.common.store.sqlite_queue import SqliteQueueStore
from services.queue.config import QueueSettings
from services.queue.leases import LeaseTable
from services.queue.ownership import Partitions
from tests.poll import eventually

PARTITIONS = 16
TTL_MS = 300
ROUND_S = TTL_MS / 4000  # between the lease rounds a settling check runs (one per try)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


def instance(redis: Redis, store: SqliteQueueStore, name: str, prefix: str) -> Partitions:
    settings = QueueSettings(
        queue_partitions=PARTITIONS, queue_lease_ttl_ms=TTL_MS, metrics_port=-1
    )
    leases = LeaseTable(redis, name, PARTITIONS, TTL_MS, prefix)
    return Partitions(settings=settings, instance_id=name, leases=leases, store=store)


async def test_join_share_and_takeover_of_a_silent_instance(redis: Redis, tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path / "q.db")
    prefix = f"t-{uuid.uuid4().hex}:"
    a = instance(redis, store, "a", prefix)
    b = instance(redis, store, "b", prefix)
    lost_by_a: set[int] = set()
    a.on_lost = lost_by_a.update
    await a.tick()
    assert set(a.epochs) == set(range(PARTITIONS))  # alone: everything

    async def shared() -> bool:
        await a.tick()
        await b.tick()
        return len(a.epochs) == len(b.epochs) == PARTITIONS // 2

    # b joined: a gave half up, b claimed it.
    await eventually(shared, 5, "ownership settled", ROUND_S)
    assert set(a.epochs).isdisjoint(b.epochs)
    assert lost_by_a == set(b.epochs)
    given = min(b.epochs)
    stale_epoch = 1  # a's claim of every partition at the start
    item = NewQueueItem("m1", 1, b"x", 0)
    refused = await store.append("t", "q", [item], given, stale_epoch, 0, True)
    assert refused.outcomes == [AppendOutcome.FENCED]  # a lost it: the store refuses a
    ok = await store.append("t", "q", [item], given, b.epochs[given], 0, True)
    assert ok.outcomes == [AppendOutcome.OK]

    # a goes silent (a crash): its leases run out and b takes every partition.
    held_by_a = dict(a.epochs)
    started = time.monotonic()

    async def b_has_all() -> bool:
        await b.tick()
        return len(b.epochs) == PARTITIONS

    await eventually(b_has_all, 5, "ownership settled", ROUND_S)
    moved_s = time.monotonic() - started
    assert moved_s < 5 * TTL_MS / 1000  # about one ttl, not a timeout's worth
    for p, epoch in held_by_a.items():
        late = await store.append("t", f"q{p}", [item], p, epoch, 0, True)
        assert late.outcomes == [AppendOutcome.FENCED]

    # a comes back: it finds its leases gone, and gets its share again as b sheds it.
    await eventually(shared, 5, "ownership settled", ROUND_S)
    await store.close()


async def test_a_graceful_stop_hands_partitions_over_at_once(redis: Redis, tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path / "q.db")
    prefix = f"t-{uuid.uuid4().hex}:"
    a = instance(redis, store, "a", prefix)
    b = instance(redis, store, "b", prefix)
    await a.tick()
    await a.leave()  # released, not left to run out
    await b.tick()
    assert len(b.epochs) == PARTITIONS
    await store.close()
