"""The gRPC helper: health, reflection, admin token and the error-to-status mapping."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.rpc.server import check_health, create_server, set_serving, stop_server
from services.metrics.api import MetricsAdminApi, MetricsApi
from services.metrics.core import ClusterStats
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


@pytest.fixture
async def server():  # type: ignore[no-untyped-def]
    stats = ClusterStats(30)

    def register(s: grpc.aio.Server) -> list[str]:
        pb_grpc.add_MetricsServiceServicer_to_server(MetricsApi(stats), s)
        pb_grpc.add_MetricsAdminServiceServicer_to_server(MetricsAdminApi(stats), s)
        return [d.full_name for d in pb.DESCRIPTOR.services_by_name.values()]

    srv, port, health = create_server("127.0.0.1:0", register, admin_token="s3cret")
    await srv.start()
    await set_serving(health, ["starling.metrics.v1.MetricsService"])
    yield f"127.0.0.1:{port}"
    await stop_server(srv, health, 1)


async def test_health_and_reflection(server: str) -> None:
    assert await check_health(server) == "SERVING"
    async with grpc.aio.insecure_channel(server) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="starling.metrics.v1.MetricsService")
        )
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        names: set[str] = set()
        async for r in stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        ):
            names |= {s.name for s in r.list_services_response.service}
    assert {
        "starling.metrics.v1.MetricsService",
        "starling.metrics.v1.MetricsAdminService",
        "grpc.health.v1.Health",
    } <= names


async def test_admin_calls_need_the_token(server: str) -> None:
    async with grpc.aio.insecure_channel(server) as ch:
        stub = pb_grpc.MetricsAdminServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetClusterStats(pb.GetClusterStatsRequest())
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = await stub.GetClusterStats(
            pb.GetClusterStatsRequest(), metadata=[("authorization", "Bearer s3cret")]
        )
        assert ok.nodes == 0


async def test_bad_request_maps_to_invalid_argument_with_message(server: str) -> None:
    async with grpc.aio.insecure_channel(server) as ch:
        stub = pb_grpc.MetricsServiceStub(ch)  # internal API: no token needed
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ReportNodeStats(pb.ReportNodeStatsRequest())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "node_id" in (info.value.details() or "")
        await stub.ReportNodeStats(
            pb.ReportNodeStatsRequest(
                node_id="n1", tenants=[pb.TenantCounters(tenant="t", connections=3)]
            )
        )
        admin = pb_grpc.MetricsAdminServiceStub(ch)
        stats = await admin.GetClusterStats(
            pb.GetClusterStatsRequest(), metadata=[("authorization", "Bearer s3cret")]
        )
        assert stats.nodes == 1 and stats.tenants[0].connections == 3
