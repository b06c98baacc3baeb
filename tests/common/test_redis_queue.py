"""What only the Redis Streams queue store (services/common/store/redis_queue.py) has beyond
the contract: the partition's set of registered queues stays near its live queues (claims
and sweeps forget dropped ones) while fencing still holds, a dropped queue's stale owner is
fenced on its next write, and message ids are forgotten after the de-duplication window."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from services.common.store import redis_queue
from services.common.store import redis_queue_lua as lua
from services.common.store.ports_queue import AppendOutcome
from services.common.store.redis_queue import RedisQueueStore
from tests.common.queue_stores import items, redis_queues
from tests.poll import eventually


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisQueueStore]:
    s = redis_queues(redis_url, f"tq{uuid.uuid4().hex[:8]}:")
    yield s
    await s.close()


async def _registered(store: RedisQueueStore, partition: int) -> int:
    return int(await store._r.scard(lua.partition_keys(store._prefix, partition)[1]))


async def test_dropped_queues_are_forgotten_by_sweeps_and_claims(
    store: RedisQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_queue, "SWEEP_EVERY", 5)
    epoch = await store.claim_partition(1)
    for i in range(30):  # a session's queue each: appended to, then dropped
        assert (await store.append("t", f"c{i}#1", items(1), 1, epoch, 0, True)).outcomes == [
            AppendOutcome.OK
        ]
        if i % 10:
            await store.drop("t", f"c{i}#1")
    assert await _registered(store, 1) <= 3 + 6  # the 3 live ones and those since the sweep
    new = await store.claim_partition(1)
    assert await _registered(store, 1) == 3
    for i in (0, 10, 20):  # the live queues are still fenced against the old epoch
        stale = await store.append("t", f"c{i}#1", items(1, 1), 1, epoch, 0, True)
        assert stale.outcomes == [AppendOutcome.FENCED]
        assert (await store.append("t", f"c{i}#1", items(1, 1), 1, new, 0, True)).outcomes == [
            AppendOutcome.OK
        ]


async def test_a_stale_owner_of_a_dropped_queue_is_fenced(store: RedisQueueStore) -> None:
    old = await store.claim_partition(2)
    await store.append("t", "c#1", items(2), 2, old, 0, True)
    await store.drop("t", "c#1")
    new = await store.claim_partition(2)  # forgets the dropped queue
    assert await _registered(store, 2) == 0
    late = await store.append("t", "c#1", items(1, 5), 2, old, 0, True)
    assert late.outcomes == [AppendOutcome.FENCED]
    assert (await store.state("t", "c#1")).last_seq == 0
    res = await store.append("t", "c#1", items(1, 5), 2, new, 0, True)
    assert (res.outcomes, res.last_seq) == ([AppendOutcome.OK], 1)


async def test_message_ids_are_forgotten_after_the_window(
    store: RedisQueueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_queue, "MSGID_RETENTION_MS", 200)
    epoch = await store.claim_partition(3)
    await store.append("t", "c#1", items(1), 3, epoch, 0, True)
    again = await store.append("t", "c#1", items(1), 3, epoch, 0, True)
    assert again.outcomes == [AppendOutcome.DUPLICATE]

    async def stored_again() -> bool:
        res = await store.append("t", "c#1", items(1), 3, epoch, 0, True)
        return res.outcomes == [AppendOutcome.OK]

    await eventually(stored_again, 5, "the message id forgotten")
    ids = lua.queue_base(store._prefix, "t", "c#1") + ":ids"
    assert 0 < await store._r.pttl(ids) <= 200
