"""An upgrade keeps the tenant limits an operator set: limits written under the keys before
the Redis Cluster layout are moved to their tagged keys when the quota service starts
(services/quota/key_migration.py), on a real redis-server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.common.quota_keys import limits_key
from services.quota.key_migration import migrate_limit_keys, tagged_key


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


async def test_old_tenant_and_user_limits_move_to_their_tagged_keys(redis: Redis) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await redis.hset(f"st:quota:{t}:limits", mapping={"max_connections": 7})  # type: ignore[misc]
    await redis.hset(f"st:quota:{t}:u:dev:1:limits", mapping={"messages_per_s": 3})  # type: ignore[misc]
    assert await migrate_limit_keys(redis) >= 2
    assert await redis.hgetall(limits_key(t)) == {b"max_connections": b"7"}  # type: ignore[misc]
    assert await redis.hgetall(limits_key(t, "dev:1")) == {b"messages_per_s": b"3"}  # type: ignore[misc]
    assert not await redis.exists(f"st:quota:{t}:limits", f"st:quota:{t}:u:dev:1:limits")


async def test_a_limit_set_since_the_upgrade_wins_over_the_old_one(redis: Redis) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    await redis.hset(f"st:quota:{t}:limits", mapping={"max_connections": 7})  # type: ignore[misc]
    await redis.hset(limits_key(t), mapping={"max_connections": 9})  # type: ignore[misc]
    await migrate_limit_keys(redis)
    assert await redis.hgetall(limits_key(t)) == {b"max_connections": b"9"}  # type: ignore[misc]
    assert not await redis.exists(f"st:quota:{t}:limits")


def test_only_limits_keys_of_the_old_shape_are_moved() -> None:
    assert tagged_key("st:quota:acme:limits") == limits_key("acme")
    assert tagged_key("st:quota:{acme}:limits") is None
    assert tagged_key("st:quota:acme:u::limits") is None
    assert tagged_key("st:quota:not a tenant:limits") is None
