"""The quota clients against the quota service in this process (a real redis-server): limits
and leases as domain values."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.msg import Msg
from redis.asyncio import Redis

from services.common.bans import Ban, BanKind
from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.common.rpc.errors import InvalidArgumentError, PermissionDeniedError
from services.quota.client import Lease, LeaseResult, Limits, QuotaAdminClient, QuotaClient
from services.quota.config import QuotaSettings
from services.quota.main import QuotaService
from starling.quota.v1 import quota_pb2
from tests.inproc import ADMIN_TOKEN, serving


@pytest.fixture(scope="module")
async def address(
    redis_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    settings = QuotaSettings(
        redis_url=redis_url.rsplit("/", 1)[0] + "/7",  # a database of its own: flushed below
        nats_url=nats_url,
        metrics_port=-1,
        node_id="quota-t",
        data_dir=tmp_path_factory.mktemp("quota"),
    )
    async with serving(QuotaService(settings)) as addr:
        yield addr


async def test_limits_and_leases(address: str) -> None:
    tenant = f"q{uuid.uuid4().hex[:6]}"
    admin = QuotaAdminClient(address, ADMIN_TOKEN)
    quota = QuotaClient(address)
    assert await admin.get_limits(tenant) == Limits()
    limits = Limits(max_connections=3, max_messages_per_s=100)
    await admin.set_limits(tenant, limits)
    assert await admin.get_limits(tenant) == limits

    assert await quota.acquire_lease(tenant, "n1", "connections", 2) == Lease(
        LeaseResult.GRANTED, 2, 1000, 3
    )
    partial = await quota.acquire_lease(tenant, "n1", "connections", 2)
    assert (partial.result, partial.granted) == (LeaseResult.GRANTED, 1)
    refused = await quota.acquire_lease(tenant, "n1", "connections", 1)
    assert (refused.result, refused.granted) == (LeaseResult.EXCEED_LIMIT, 0)
    with pytest.raises(InvalidArgumentError, match="bogus"):
        await quota.acquire_lease(tenant, "n1", "bogus", 1)
    await admin.close()
    await quota.close()


async def test_bans_survive_a_redis_flush_and_are_announced(
    address: str, redis_url: str, nats_url: str
) -> None:
    tenant = f"q{uuid.uuid4().hex[:6]}"
    admin = QuotaAdminClient(address, ADMIN_TOKEN)
    nc = await nats.connect(nats_url)
    heard: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await heard.put(msg.data)

    await nc.subscribe(subjects.QUOTA_BANS_CHANGED, cb=on_msg)
    await flushed(nc)
    stored = await admin.add_ban(
        Ban(kind=BanKind.ADDRESS, tenant=tenant, value="::ffff:198.51.100.7", reason="abuse"), 600
    )
    assert stored.value == "198.51.100.7/32" and stored.expires_at_ms > time.time() * 1000
    announced = quota_pb2.ListBansResponse.FromString(await asyncio.wait_for(heard.get(), 5))
    assert any(b.tenant == tenant for b in announced.bans)

    redis = Redis.from_url(redis_url.rsplit("/", 1)[0] + "/7")
    await redis.flushdb()
    await redis.aclose()
    assert stored in await admin.list_bans()

    with pytest.raises(InvalidArgumentError, match="tenant"):
        await admin.add_ban(Ban(kind=BanKind.CLIENT_ID, tenant="", value="c"))
    with pytest.raises(InvalidArgumentError):
        await admin.add_ban(Ban(kind=BanKind.ADDRESS, tenant="", value="300.1.1.1"))
    assert await admin.remove_ban(BanKind.ADDRESS, tenant, "198.51.100.7")
    assert not await admin.remove_ban(BanKind.ADDRESS, tenant, "198.51.100.7")
    assert all(b.tenant != tenant for b in await admin.list_bans())
    await nc.drain()
    await admin.close()


async def test_rate_leases_are_per_window_and_per_user(address: str) -> None:
    tenant = f"q{uuid.uuid4().hex[:6]}"
    admin = QuotaAdminClient(address, ADMIN_TOKEN)
    quota = QuotaClient(address)
    await admin.set_limits(tenant, Limits(max_messages_per_s=10))
    await admin.set_limits(tenant, Limits(max_messages_per_s=3), user="bob")
    assert await admin.get_limits(tenant, "bob") == Limits(max_messages_per_s=3)
    # Just after a window starts, so that the two calls below share it.
    await asyncio.sleep(1 - time.time() % 1 + 0.01)
    lease = await quota.acquire_lease(tenant, "n1", "messages_per_s", 8)
    assert (lease.granted, lease.limit) == (8, 10) and 0 < lease.ttl_ms <= 1000
    assert lease.nodes == 1  # the nodes asking for the budget: its fair share is the limit
    second = await quota.acquire_lease(tenant, "n2", "messages_per_s", 8)
    assert (second.granted, second.nodes) == (2, 2)
    # A node asking again is counted once; the user's budget counts its own nodes.
    assert (await quota.acquire_lease(tenant, "n1", "messages_per_s", 1)).nodes == 2
    bob = await quota.acquire_lease(tenant, "n1", "messages_per_s", 8, user="bob")
    assert (bob.granted, bob.limit, bob.nodes) == (3, 3, 1)
    unlimited = await quota.acquire_lease(tenant, "n1", "bytes_in_per_s", 5)
    assert (unlimited.result, unlimited.limit, unlimited.nodes) == (LeaseResult.GRANTED, 0, 0)
    await admin.close()
    await quota.close()


async def test_a_wrong_admin_token_is_permission_denied(address: str) -> None:
    admin = QuotaAdminClient(address, "wrong")
    with pytest.raises(PermissionDeniedError):
        await admin.set_limits("t", Limits(max_sessions=1))
    await admin.close()


def test_limits_and_results_match_the_proto() -> None:
    assert {f.name for f in quota_pb2.Limits.DESCRIPTOR.fields} == set(Limits.__dataclass_fields__)
    assert {r.name: int(r) for r in LeaseResult} == {
        quota_pb2.LeaseResult.Name(v).removeprefix("LEASE_RESULT_"): v
        for v in quota_pb2.LeaseResult.values()
        if v != quota_pb2.LEASE_RESULT_UNSPECIFIED
    }
