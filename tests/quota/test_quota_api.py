"""The quota service over gRPC against a real redis-server: limits and leases."""

from __future__ import annotations

import grpc
import pytest
from redis.asyncio import Redis

from services.common.rpc.server import create_server, set_serving, stop_server
from services.quota.api import QuotaAdminApi, QuotaApi
from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc


async def test_limits_and_leases(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)

    def register(s: grpc.aio.Server) -> list[str]:
        pb_grpc.add_QuotaServiceServicer_to_server(QuotaApi(redis, 1000), s)
        pb_grpc.add_QuotaAdminServiceServicer_to_server(QuotaAdminApi(redis), s)
        return []

    server, port, health = create_server("127.0.0.1:0", register)
    await server.start()
    await set_serving(health, [])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        admin = pb_grpc.QuotaAdminServiceStub(ch)
        quota = pb_grpc.QuotaServiceStub(ch)
        await admin.SetLimits(
            pb.SetLimitsRequest(
                tenant="acme", limits=pb.Limits(max_connections=3, max_messages_per_s=100)
            )
        )
        got = await admin.GetLimits(pb.GetLimitsRequest(tenant="acme"))
        assert (got.limits.max_connections, got.limits.max_messages_per_s) == (3, 100)

        def lease(resource: str, amount: int) -> pb.AcquireLeaseRequest:
            return pb.AcquireLeaseRequest(
                tenant="acme", node_id="n1", resource=resource, amount=amount
            )

        first = await quota.AcquireLease(lease("connections", 2))
        assert (first.result, first.granted) == (pb.LEASE_RESULT_GRANTED, 2)
        partial = await quota.AcquireLease(lease("connections", 2))
        assert (partial.result, partial.granted) == (pb.LEASE_RESULT_GRANTED, 1)
        refused = await quota.AcquireLease(lease("connections", 1))
        assert (refused.result, refused.granted) == (pb.LEASE_RESULT_EXCEED_LIMIT, 0)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await quota.AcquireLease(lease("bogus", 1))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "bogus" in (info.value.details() or "")
    await stop_server(server, health, 1)
    await redis.aclose()
