"""The metrics clients against the metrics service in this process: domain counters in,
cluster totals out, and the error mapping every client shares."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from services.cli.ports import free_port
from services.common.rpc.errors import InvalidArgumentError, PermissionDeniedError, UnavailableError
from services.metrics.client import ClusterTotals, MetricsAdminClient, MetricsClient, TenantCounters
from services.metrics.config import MetricsSettings
from services.metrics.main import MetricsService
from tests.inproc import ADMIN_TOKEN, serving


@pytest.fixture(scope="module")
async def address() -> AsyncIterator[str]:
    async with serving(
        MetricsService(MetricsSettings(metrics_port=-1, cluster_metrics_port=-1, sys_interval_s=0))
    ) as addr:
        yield addr


async def test_reports_of_every_node_are_summed(address: str) -> None:
    client = MetricsClient(address)
    admin = MetricsAdminClient(address, ADMIN_TOKEN)
    await client.report("n1", [TenantCounters(tenant="a", connections=2, messages_in=5)])
    await client.report(
        "n2",
        [
            TenantCounters(tenant="a", connections=1, messages_out=4, messages_dropped=1),
            TenantCounters(tenant="b", connections=1),
        ],
    )
    assert await admin.cluster_stats() == ClusterTotals(
        (
            TenantCounters(
                tenant="a", connections=3, messages_in=5, messages_out=4, messages_dropped=1
            ),
            TenantCounters(tenant="b", connections=1),
        ),
        nodes=2,
    )
    await client.close()
    await admin.close()


async def test_a_bad_request_is_invalid_argument_naming_the_field(address: str) -> None:
    client = MetricsClient(address)
    with pytest.raises(InvalidArgumentError, match="node_id"):
        await client.report("", [])
    await client.close()


async def test_a_wrong_admin_token_is_permission_denied(address: str) -> None:
    for token in ("wrong", ""):
        admin = MetricsAdminClient(address, token)
        with pytest.raises(PermissionDeniedError) as info:
            await admin.cluster_stats()
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        await admin.close()


async def test_an_unreachable_service_is_unavailable() -> None:
    client = MetricsClient(f"127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(UnavailableError):
        await client.report("n1", [])
    await client.close()
