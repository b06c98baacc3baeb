"""The quota clients against the quota service in this process (a real redis-server): limits
and leases as domain values."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

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
        redis_url=redis_url,
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
