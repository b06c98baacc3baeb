"""Typed clients of the quota service: `QuotaClient` for nodes (leases of a tenant's budgets)
and `QuotaAdminClient` for operators (a tenant's limits)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum

from services.common.rpc.client import LazyStub
from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc


class LeaseResult(IntEnum):
    """Values of `starling.quota.v1.LeaseResult`."""

    GRANTED = pb.LEASE_RESULT_GRANTED  # `granted` (> 0, maybe less than asked) is yours
    EXCEED_LIMIT = pb.LEASE_RESULT_EXCEED_LIMIT  # the budget is spent: refuse the work
    TRY_LATER = pb.LEASE_RESULT_TRY_LATER


@dataclass(frozen=True, slots=True)
class Lease:
    result: LeaseResult
    granted: int
    ttl_ms: int  # ask again after this


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """A tenant's limits; 0 means unlimited."""

    max_connections: int = 0
    max_sessions: int = 0
    max_subscriptions_per_client: int = 0
    max_messages_per_s: int = 0
    max_bytes_in_per_s: int = 0
    max_bytes_out_per_s: int = 0
    max_queue_depth: int = 0


_LIMIT_FIELDS = tuple(f.name for f in fields(Limits))


class QuotaClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.QuotaServiceStub, timeout_s=timeout_s)

    async def acquire_lease(self, tenant: str, node_id: str, resource: str, amount: int) -> Lease:
        """Take up to `amount` of a budget ("connections", "sessions", "messages_per_s",
        "bytes_in_per_s", "bytes_out_per_s"); an unknown resource is `InvalidArgumentError`."""
        req = pb.AcquireLeaseRequest(
            tenant=tenant, node_id=node_id, resource=resource, amount=amount
        )
        resp = await self._rpc.call(self._rpc.stub.AcquireLease, req)
        return Lease(LeaseResult(resp.result), resp.granted, resp.ttl_ms)

    async def close(self) -> None:
        await self._rpc.close()


class QuotaAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.QuotaAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def set_limits(self, tenant: str, limits: Limits) -> None:
        values = {name: getattr(limits, name) for name in _LIMIT_FIELDS}
        req = pb.SetLimitsRequest(tenant=tenant, limits=pb.Limits(**values))
        await self._rpc.call(self._rpc.stub.SetLimits, req)

    async def get_limits(self, tenant: str) -> Limits:
        resp = await self._rpc.call(self._rpc.stub.GetLimits, pb.GetLimitsRequest(tenant=tenant))
        return Limits(**{name: getattr(resp.limits, name) for name in _LIMIT_FIELDS})

    async def close(self) -> None:
        await self._rpc.close()
