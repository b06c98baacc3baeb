"""A tenant's first CONNECT is not a lost registry: it installs without asking every node to
re-assert what it holds, while a tenant whose keys Redis lost is still noticed (on a database
of its own of the shared redis-server of tests/conftest.py: the tests delete the registry's
global keys, which the session services of other tests must not see)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.session.registry import GENERATION, Holder, Registry
from services.session.registry_keys import TENANTS, clients_key, generation_key


@pytest.fixture
async def registry(redis_url: str) -> AsyncIterator[Registry]:
    redis = Redis.from_url(redis_url.rsplit("/", 1)[0] + "/9")
    await redis.flushdb()
    reg = Registry(redis)
    await reg.check_generation()  # the registry is known: its global sentinel is there
    try:
        yield reg
    finally:
        await redis.aclose()


def _tenant() -> str:
    return f"nt{uuid.uuid4().hex[:8]}"


async def test_a_new_tenants_first_connect_reports_no_loss(registry: Registry) -> None:
    tenant = _tenant()
    first = await registry.claim(Holder(tenant, "c1", "node-a", registry.next_epoch()))
    assert first.won and not first.generation
    # The tenant's sentinel holds the registry's generation; the check finds nothing missing.
    redis = registry._redis
    assert await redis.get(generation_key(tenant)) == await redis.get(GENERATION)
    assert await registry.check_generation() is None
    second = await registry.claim(Holder(tenant, "c2", "node-a", registry.next_epoch()))
    assert second.won and not second.generation


async def test_a_tenant_whose_keys_were_lost_is_still_noticed(registry: Registry) -> None:
    tenant = _tenant()
    assert (await registry.claim(Holder(tenant, "c1", "node-a", registry.next_epoch()))).won
    # A cluster shard restarted empty: the tenant's slot lost its keys, the index kept it.
    redis = registry._redis
    await redis.delete(generation_key(tenant), clients_key(tenant))
    assert await redis.sismember(TENANTS, tenant)  # type: ignore[misc]
    other = Registry(redis)  # another instance: no cache of the tenant
    after = await other.claim(Holder(tenant, "c2", "node-b", other.next_epoch()))
    assert after.won and after.generation


async def test_a_lost_index_is_noticed_although_its_tenants_look_new(registry: Registry) -> None:
    tenant = _tenant()
    assert (await registry.claim(Holder(tenant, "c1", "node-a", registry.next_epoch()))).won
    redis = registry._redis
    await redis.delete(TENANTS, GENERATION, generation_key(tenant))  # the whole registry
    other = Registry(redis)
    after = await other.claim(Holder(tenant, "c2", "node-b", other.next_epoch()))
    assert after.won and after.generation
