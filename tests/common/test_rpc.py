"""The gRPC helper: health, reflection, mesh secret, admin token and the error-to-status
mapping."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.rpc.client import LazyStub, target
from services.common.rpc.credentials import MESH_METADATA_KEY
from services.common.rpc.server import (
    ServerAuth,
    check_health,
    create_server,
    set_serving,
    stop_server,
)
from services.metrics.api import MetricsAdminApi, MetricsApi
from services.metrics.core import ClusterStats
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc

MESH = [(MESH_METADATA_KEY, "m3sh")]


@pytest.fixture
async def server():  # type: ignore[no-untyped-def]
    stats = ClusterStats(30)

    def register(s: grpc.aio.Server) -> list[str]:
        pb_grpc.add_MetricsServiceServicer_to_server(MetricsApi(stats), s)
        pb_grpc.add_MetricsAdminServiceServicer_to_server(MetricsAdminApi(stats), s)
        return [d.full_name for d in pb.DESCRIPTOR.services_by_name.values()]

    auth = ServerAuth(mesh_secret="m3sh", admin_token="s3cret")
    srv, port, health = create_server("127.0.0.1:0", register, auth=auth)
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
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=MESH
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
        stub = pb_grpc.MetricsServiceStub(ch)  # internal API: the mesh secret, no admin token
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ReportNodeStats(pb.ReportNodeStatsRequest(), metadata=MESH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "node_id" in (info.value.details() or "")
        await stub.ReportNodeStats(
            pb.ReportNodeStatsRequest(
                node_id="n1", tenants=[pb.TenantCounters(tenant="t", connections=3)]
            ),
            metadata=MESH,
        )
        admin = pb_grpc.MetricsAdminServiceStub(ch)
        stats = await admin.GetClusterStats(
            pb.GetClusterStatsRequest(), metadata=[("authorization", "Bearer s3cret")]
        )
        assert stats.nodes == 1 and stats.tenants[0].connections == 3


async def test_internal_calls_and_reflection_need_the_mesh_secret(server: str) -> None:
    async with grpc.aio.insecure_channel(server) as ch:
        stub = pb_grpc.MetricsServiceStub(ch)
        request = pb.ReportNodeStatsRequest(node_id="n1")
        for metadata in (
            None,
            [(MESH_METADATA_KEY, "wrong")],
            [("authorization", "Bearer s3cret")],
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ReportNodeStats(request, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "mesh secret" in (info.value.details() or "")
        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            ):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_an_empty_operator_token_opens_nothing() -> None:
    """A server built without an operator token (or mesh secret) refuses admin and internal
    calls, even ones presenting an empty token: a missing setting never opens a door."""
    stats = ClusterStats(30)

    def register(s: grpc.aio.Server) -> list[str]:
        pb_grpc.add_MetricsServiceServicer_to_server(MetricsApi(stats), s)
        pb_grpc.add_MetricsAdminServiceServicer_to_server(MetricsAdminApi(stats), s)
        return []

    srv, port, health = create_server("127.0.0.1:0", register, auth=ServerAuth(mesh_secret=""))
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            for md in (None, [("authorization", "Bearer ")], [("authorization", "Bearer")]):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await pb_grpc.MetricsAdminServiceStub(ch).GetClusterStats(
                        pb.GetClusterStatsRequest(), metadata=md
                    )
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.MetricsServiceStub(ch).ReportNodeStats(
                    pb.ReportNodeStatsRequest(node_id="n"), metadata=[(MESH_METADATA_KEY, "")]
                )
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await stop_server(srv, health, 1)


async def test_a_dns_name_of_every_instance_is_one_balanced_channel(server: str) -> None:
    """What deploy/ gives as a service address (a name resolving to every instance) is
    called through the fail-over channel, and reaches the service."""
    port = server.rsplit(":", 1)[1]
    address = f"dns:///localhost:{port}"
    assert target(address) == (address, True)
    assert target("router:7002") == ("router:7002", False)  # one instance or a balancer
    stub = LazyStub(address, health_pb2_grpc.HealthStub, timeout_s=5)
    resp = await stub.call(stub.stub.Check, health_pb2.HealthCheckRequest())
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    await stub.close()
