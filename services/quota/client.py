"""Typed clients of the quota service: `QuotaClient` for nodes and session services (leases
of a tenant's budgets, the ban list, automatic bans) and `QuotaAdminClient` for operators
(limits and bans)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum

from services.common.bans import Ban, BanKind
from services.common.rpc.client import LazyStub
from services.common.tenant_limits import Limits
from services.quota.ban_codec import ban_from_pb, ban_to_pb
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
    ttl_ms: int  # use the grant within this (rates: the rest of the one-second window)
    limit: int = 0  # the limit it came from; 0: unlimited
    # Rate budgets: nodes that asked within the service's share horizon (0: not told).
    nodes: int = 0


_LIMIT_FIELDS = tuple(f.name for f in fields(Limits))


def bans_from_announcement(data: bytes) -> list[Ban]:
    """The whole ban list as the quota service announces it on `ctl.quota.bans` (a
    ListBansResponse); raises on a payload that does not decode."""
    return [ban_from_pb(b) for b in pb.ListBansResponse.FromString(data).bans]


def _add_request(ban: Ban, duration_s: int) -> pb.AddBanRequest:
    return pb.AddBanRequest(ban=ban_to_pb(ban), duration_s=duration_s)


class QuotaClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.QuotaServiceStub, timeout_s=timeout_s)

    async def acquire_lease(
        self, tenant: str, node_id: str, resource: str, amount: int, user: str = ""
    ) -> Lease:
        """Take up to `amount` of a budget ("connections", "sessions", "messages_per_s",
        "bytes_in_per_s", "bytes_out_per_s") of the tenant, or of its `user`; an unknown
        resource is `InvalidArgumentError`."""
        req = pb.AcquireLeaseRequest(
            tenant=tenant, node_id=node_id, resource=resource, amount=amount, user=user
        )
        resp = await self._rpc.call(self._rpc.stub.AcquireLease, req)
        return Lease(LeaseResult(resp.result), resp.granted, resp.ttl_ms, resp.limit, resp.nodes)

    async def get_limits(self, tenant: str, user: str = "") -> Limits:
        """The tenant's (or its user's) limits, as the enforcing services read them."""
        req = pb.GetLimitsRequest(tenant=tenant, user=user)
        resp = await self._rpc.call(self._rpc.stub.GetLimits, req)
        return Limits(**{name: getattr(resp.limits, name) for name in _LIMIT_FIELDS})

    async def hold_subscriptions(
        self, tenant: str, node_id: str, held: int, amount: int = 0
    ) -> tuple[int, int]:
        """Report the subscriptions `node_id` holds for `tenant` and ask slots for `amount`
        new ones; returns (granted, the tenant's max_tenant_subscriptions; 0: none)."""
        req = pb.HoldSubscriptionsRequest(tenant=tenant, node_id=node_id, held=held, amount=amount)
        resp = await self._rpc.call(self._rpc.stub.HoldSubscriptions, req)
        return resp.granted, resp.limit

    async def list_bans(self) -> list[Ban]:
        resp = await self._rpc.call(self._rpc.stub.ListBans, pb.ListBansRequest())
        return [ban_from_pb(b) for b in resp.bans]

    async def add_ban(self, ban: Ban, duration_s: int = 0) -> Ban:
        """A ban decided inside the mesh (flapping)."""
        resp = await self._rpc.call(self._rpc.stub.AddBan, _add_request(ban, duration_s))
        return ban_from_pb(resp.ban)

    async def close(self) -> None:
        await self._rpc.close()


class QuotaAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.QuotaAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def set_limits(self, tenant: str, limits: Limits, user: str = "") -> None:
        values = {name: getattr(limits, name) for name in _LIMIT_FIELDS}
        req = pb.SetLimitsRequest(tenant=tenant, limits=pb.Limits(**values), user=user)
        await self._rpc.call(self._rpc.stub.SetLimits, req)

    async def get_limits(self, tenant: str, user: str = "") -> Limits:
        req = pb.GetLimitsRequest(tenant=tenant, user=user)
        resp = await self._rpc.call(self._rpc.stub.GetLimits, req)
        return Limits(**{name: getattr(resp.limits, name) for name in _LIMIT_FIELDS})

    async def add_ban(self, ban: Ban, duration_s: int = 0) -> Ban:
        """Add (or replace) a ban; `duration_s` > 0 sets its expiry from now. Returns the ban
        as stored (its value in canonical form)."""
        resp = await self._rpc.call(self._rpc.stub.AddBan, _add_request(ban, duration_s))
        return ban_from_pb(resp.ban)

    async def list_bans(self, tenant: str = "") -> list[Ban]:
        """Every ban in force (operator), or `tenant`'s own (a tenant token may ask for its
        own tenant's)."""
        req = pb.ListBansRequest(tenant=tenant)
        resp = await self._rpc.call(self._rpc.stub.ListBans, req)
        return [ban_from_pb(b) for b in resp.bans]

    async def remove_ban(self, kind: BanKind, tenant: str, value: str) -> bool:
        req = pb.RemoveBanRequest(kind=int(kind), tenant=tenant, value=value)  # type: ignore[arg-type]
        resp = await self._rpc.call(self._rpc.stub.RemoveBan, req)
        return bool(resp.removed)

    async def close(self) -> None:
        await self._rpc.close()
