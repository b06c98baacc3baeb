"""The per-tenant queue backends (services/common/store/tenant_queues.py): two tenants on
different kinds, each tenant's queues only in its own backend, epochs fencing in both, the
start-up refusal of a tenant moved before its queues were drained, and open_queue_store
building the dispatcher from the settings. The contract itself runs on the dispatcher too
(the "tenants" parameter of tests/common/queue_stores.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.open import open_queue_store
from services.common.store.ports_queue import AppendOutcome, QueueStore
from services.common.store.redis_queue import RedisQueueStore
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.tenant_queues import QueueKindError, TenantQueueStores
from services.queue.config import QueueSettings
from tests.common.queue_stores import items, redis_queues


@pytest.fixture
async def backends(redis_url: str, tmp_path: Path) -> AsyncIterator[dict[str, QueueStore]]:
    stores: dict[str, QueueStore] = {
        "store": SqliteQueueStore(tmp_path / "q.db"),
        "redis": redis_queues(redis_url, f"tq{uuid.uuid4().hex[:8]}:"),
    }
    yield stores
    for s in stores.values():
        await s.close()


def _split(backends: dict[str, QueueStore]) -> TenantQueueStores:
    return TenantQueueStores(
        stores=backends,
        by_tenant={"on-redis": "redis"},
        default_kind="store",
    )


async def test_each_tenant_is_served_by_its_own_backend(backends: dict[str, QueueStore]) -> None:
    queues = _split(backends)
    sqlite, redis = backends["store"], backends["redis"]
    assert isinstance(sqlite, SqliteQueueStore) and isinstance(redis, RedisQueueStore)
    epoch = await queues.claim_partition(3)
    for tenant in ("on-redis", "on-store"):
        res = await queues.append(tenant, "c#1", items(3), 3, epoch, 0, True)
        assert res.outcomes == [AppendOutcome.OK] * 3
    assert (await redis.state("on-redis", "c#1")).last_seq == 3
    assert (await redis.state("on-store", "c#1")).last_seq == 0
    assert (await sqlite.state("on-store", "c#1")).last_seq == 3
    assert (await sqlite.state("on-redis", "c#1")).last_seq == 0
    assert sorted(await queues.depths()) == [
        ("on-redis", "c#1", 3, 27),
        ("on-store", "c#1", 3, 27),
    ]
    assert await queues.ack("on-redis", "c#1", 3) == (-3, -27)
    entries, _ = await queues.read("on-store", "c#1", 1, 10)
    assert [e.seq for e in entries] == [1, 2, 3]


async def test_a_new_claim_fences_the_old_epoch_in_every_backend(
    backends: dict[str, QueueStore],
) -> None:
    queues = _split(backends)
    old = await queues.claim_partition(4)
    new = await queues.claim_partition(4)
    assert new > old
    for tenant in ("on-redis", "on-store"):
        stale = await queues.append(tenant, "c#1", items(1), 4, old, 0, True)
        assert stale.outcomes == [AppendOutcome.FENCED]
        res = await queues.append(tenant, "c#1", items(1), 4, new, 0, True)
        assert res.outcomes == [AppendOutcome.OK]
    unknown = await queues.append("on-redis", "c#1", items(1, 1), 4, new + 100, 0, True)
    assert unknown.outcomes == [AppendOutcome.FENCED]


async def test_moving_a_tenant_with_queued_entries_is_refused_until_drained(
    backends: dict[str, QueueStore],
) -> None:
    before = _split(backends)
    epoch = await before.claim_partition(5)
    await before.append("on-redis", "c#1", items(2), 5, epoch, 0, True)
    moved = TenantQueueStores(stores=backends, by_tenant={}, default_kind="store")
    with pytest.raises(QueueKindError, match=r"queue_store_by_tenant.*'on-redis'.*'redis'"):
        await moved.claim_partition(5)
    await before.ack("on-redis", "c#1", 2)  # drained: the move is allowed
    assert await moved.claim_partition(5) > epoch


async def test_open_queue_store_follows_the_settings(redis_url: str, tmp_path: Path) -> None:
    alone = open_queue_store(QueueSettings(data_dir=tmp_path))
    assert isinstance(alone, SqliteQueueStore)
    await alone.close()
    settings = QueueSettings(
        data_dir=tmp_path,
        queue_store_by_tenant={"fast": "redis"},
        queue_redis_url=redis_url,
        queue_redis_key_prefix=f"tq{uuid.uuid4().hex[:8]}:",
    )
    split = open_queue_store(settings)
    try:
        assert isinstance(split, TenantQueueStores)
        assert (split.kind_of("fast"), split.kind_of("other")) == ("redis", "store")
        epoch = await split.claim_partition(0)
        res = await split.append("fast", "c#1", items(1), 0, epoch, 0, True)
        assert res.outcomes == [AppendOutcome.OK]
        assert await split.depths() == [("fast", "c#1", 1, 9)]
    finally:
        await split.close()
