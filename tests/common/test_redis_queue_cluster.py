"""The Redis Streams queue store on a real three-primary Redis Cluster
(tests/common/redis_cluster.py): the queue contract (tests/common/test_store_contract_queue
*.py) run again there, where Redis refuses a script touching a key of another slot; and,
without Redis, the key layout: a queue's keys share one slot whatever its name holds."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from services.cli.redis_cluster import LocalCluster
from services.common.store import redis_queue_lua as lua
from services.common.store.redis_queue import RedisQueueStore
from tests.common import test_store_contract_queue as contract
from tests.common import test_store_contract_queue_owners as owners
from tests.common.redis_cluster import (
    cluster_client,
    redis_cluster,  # noqa: F401  (the fixture)
)

CONTRACT: list[Callable[..., Awaitable[None]]] = [
    contract.test_append_read_ack_in_order,
    contract.test_append_is_idempotent_per_message_id,
    contract.test_depth_limit_policies,
    contract.test_every_write_reports_its_depth_change_and_depths_lists_queues,
    contract.test_room_bytes_refuses_what_does_not_fit,
    contract.test_released_mark_and_drop,
    contract.test_delivered_through_is_marked_by_delivery_reads_and_only_grows,
    owners.test_fencing_rejects_a_stale_owner,
    owners.test_concurrent_appends_never_share_a_seq,
    owners.test_no_stale_append_lands_once_a_claim_returned,
]


@pytest.mark.parametrize("case", CONTRACT, ids=lambda f: f.__name__)
async def test_the_queue_contract_holds_on_a_cluster(
    case: Callable[..., Awaitable[None]],
    redis_cluster: LocalCluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    client = cluster_client(redis_cluster)
    await client.initialize()
    store = RedisQueueStore(redis=client, key_prefix=f"tq{uuid.uuid4().hex[:8]}:")  # type: ignore[arg-type]
    try:
        args: list[Any] = [store, tmp_path][: case.__code__.co_argcount]
        await case(*args)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("tenant", "queue_id"),
    [("t", "c#1"), ("a}b", "c{d}#2"), ("", "}"), ("x:1", "y}:z#3"), ("é", "ü#4")],
)
def test_a_queues_keys_share_one_slot_and_name_it_unambiguously(tenant: str, queue_id: str) -> None:
    base = lua.queue_base("st:q:", tenant, queue_id)
    assert len({key_slot((base + s).encode()) for s in lua.SUFFIXES}) == 1
    assert lua.parse_base("st:q:", base) == (tenant, queue_id)
    epoch_key, queues_key = lua.partition_keys("st:q:", 7)
    assert key_slot(epoch_key.encode()) == key_slot(queues_key.encode())
