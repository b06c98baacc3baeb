"""gRPC servicers of the quota service: limits (Redis hashes), leases of rate budgets (Redis
counters per one-second window), and the ban list (the store's `BanStore`: Cassandra, so
every instance of the cluster holds one list, or SQLite embedded).

Every change is announced on NATS so that holders of a copy act on it at once: limits
(`ctl.quota.limits`, payload the tenant: nodes drop their leases of it and ask again) and the
ban list (`ctl.quota.bans`, payload the whole list). Holders also re-read the list on their
own every `ban_sync_s` (services/common/ban_watch.py), so a lost announcement costs a delay only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from redis.asyncio import Redis

from services.common import clock
from services.common.bans import Ban, BanKind, normalized
from services.common.bus import subjects
from services.common.quota_keys import limits_key, scope
from services.common.rpc.arguments import tenant_argument
from services.common.rpc.errors import InvalidArgumentError, ResourceExhaustedError
from services.common.store.ports_bans import BanStore
from services.common.subscription_counts import SubscriptionCounts
from services.quota.ban_codec import ban_to_pb
from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc

log = logging.getLogger("starling.quota")

_FIELDS = [f.name for f in pb.Limits.DESCRIPTOR.fields]
# Resources counted per second window; the rest are totals.
_RATE_RESOURCES = {
    "messages_per_s": "max_messages_per_s",
    "bytes_in_per_s": "max_bytes_in_per_s",
    "bytes_out_per_s": "max_bytes_out_per_s",
}
_TOTAL_RESOURCES = {"connections": "max_connections", "sessions": "max_sessions"}

# One round trip: read the limit, grant min(amount, limit - used) of the window (or total)
# atomically; 0 limit means unlimited (nothing counted). A rate lease also records the
# asking node in the budget's sorted set of nodes (score: the time it asked), drops those
# that have not asked within the horizon and counts the rest: the `nodes` a node divides
# the limit by when it cannot reach the service. KEYS: limits hash, counter, nodes set.
# ARGV: limit field, amount, counter TTL (ms, 0: none), node id, now (ms), horizon (ms, 0:
# no nodes set). Returns {granted, limit, nodes}.
_LEASE = """
local limit = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local amount = tonumber(ARGV[2]); local ttl = tonumber(ARGV[3])
if limit <= 0 then return {amount, 0, 0} end
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local grant = math.max(0, math.min(amount, limit - used))
if grant > 0 then
  redis.call('INCRBY', KEYS[2], grant)
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
local nodes = 0
local horizon = tonumber(ARGV[6])
if horizon > 0 then
  local now = tonumber(ARGV[5])
  redis.call('ZADD', KEYS[3], now, ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - horizon)
  redis.call('PEXPIRE', KEYS[3], horizon)
  nodes = redis.call('ZCARD', KEYS[3])
end
return {grant, limit, nodes}
"""

Publish = Callable[[str, bytes], Awaitable[None]]


async def get_limits(redis: Redis, request: pb.GetLimitsRequest) -> pb.GetLimitsResponse:
    tenant_argument(request.tenant)
    raw = await redis.hgetall(limits_key(request.tenant, request.user))  # type: ignore[misc]
    values = {k.decode(): int(v) for k, v in raw.items() if k.decode() in _FIELDS}
    return pb.GetLimitsResponse(limits=pb.Limits(**values))


def _scope(tenant: str, user: str) -> str:
    return scope(tenant, user)  # the tenant's hash tag: one slot per lease script


def _kind(value: int, name: str) -> BanKind:
    try:
        return BanKind(value)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be CLIENT_ID, USERNAME or ADDRESS") from None


class Bans:
    """Add, remove and list bans; every change is announced with the whole list."""

    def __init__(self, store: BanStore, publish: Publish, max_bans: int) -> None:
        self._store = store
        self._publish = publish
        self._max = max_bans

    async def add(self, request: pb.AddBanRequest, source: str) -> pb.AddBanResponse:
        kind = _kind(request.ban.kind, "ban.kind")
        now_ms = clock.now_ms()
        expires = request.ban.expires_at_ms
        if request.duration_s:
            expires = now_ms + request.duration_s * 1000
        if expires and expires <= now_ms:
            raise InvalidArgumentError("the ban would expire at once (expires_at_ms is past)")
        try:
            ban = normalized(
                Ban(
                    kind=kind,
                    tenant=request.ban.tenant,
                    value=request.ban.value,
                    reason=request.ban.reason[:500],
                    expires_at_ms=expires,
                    created_at_ms=now_ms,
                    source=request.ban.source or source,
                )
            )
        except ValueError as exc:
            raise InvalidArgumentError(f"ban: {exc}") from None
        if not await self._store.put(ban, self._max):
            raise ResourceExhaustedError(f"{self._max} bans are in force (setting max_bans)")
        log.info(
            "ban_added",
            extra={"kind": kind.name, "tenant": ban.tenant, "value": ban.value, "by": ban.source},
        )
        await self._announce()
        return pb.AddBanResponse(ban=ban_to_pb(ban))

    async def remove(self, request: pb.RemoveBanRequest) -> pb.RemoveBanResponse:
        kind = _kind(request.kind, "kind")
        value = request.value
        if kind is BanKind.ADDRESS:
            try:
                value = normalized(Ban(kind=kind, tenant="", value=value)).value
            except ValueError as exc:
                raise InvalidArgumentError(f"value: {exc}") from None
        removed = await self._store.remove(kind, request.tenant, value)
        if removed:
            await self._announce()
        return pb.RemoveBanResponse(removed=removed)

    async def list(self, tenant: str = "") -> pb.ListBansResponse:
        """Every ban in force, or (`tenant`) that tenant's own."""
        bans = await self._store.list()
        return pb.ListBansResponse(
            bans=[ban_to_pb(b) for b in bans if not tenant or b.tenant == tenant]
        )

    async def _announce(self) -> None:
        try:
            listed = await self.list()
            await self._publish(subjects.QUOTA_BANS_CHANGED, listed.SerializeToString())
        except Exception as exc:  # holders re-read the list every ban_sync_s anyway
            log.warning("ban_announce_failed", extra={"error": type(exc).__name__})


class QuotaAdminApi(pb_grpc.QuotaAdminServiceServicer):
    def __init__(self, redis: Redis, bans: Bans, publish: Publish) -> None:
        self._redis = redis
        self._bans = bans
        self._publish = publish

    async def SetLimits(
        self, request: pb.SetLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetLimitsResponse:
        tenant_argument(request.tenant)
        mapping = {name: getattr(request.limits, name) for name in _FIELDS}
        await self._redis.hset(limits_key(request.tenant, request.user), mapping=mapping)  # type: ignore[misc]
        log.info("limits_set", extra={"tenant": request.tenant, "user": request.user, **mapping})
        try:
            await self._publish(subjects.QUOTA_LIMITS_CHANGED, request.tenant.encode())
        except Exception as exc:  # nodes still see the change at their next lease
            log.warning("limits_announce_failed", extra={"error": type(exc).__name__})
        return pb.SetLimitsResponse()

    async def GetLimits(
        self, request: pb.GetLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLimitsResponse:
        return await get_limits(self._redis, request)

    async def AddBan(
        self, request: pb.AddBanRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddBanResponse:
        return await self._bans.add(request, "operator")

    async def ListBans(
        self, request: pb.ListBansRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListBansResponse:
        return await self._bans.list(request.tenant)

    async def RemoveBan(
        self, request: pb.RemoveBanRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveBanResponse:
        return await self._bans.remove(request)


class QuotaApi(pb_grpc.QuotaServiceServicer):
    def __init__(
        self, redis: Redis, lease_ttl_ms: int, bans: Bans, share_horizon_s: float = 60.0
    ) -> None:
        self._redis = redis
        self._ttl = lease_ttl_ms
        self._horizon_ms = int(share_horizon_s * 1000)
        self._script = redis.register_script(_LEASE)
        self._bans = bans
        self._subscriptions = SubscriptionCounts(redis)

    async def HoldSubscriptions(
        self, request: pb.HoldSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.HoldSubscriptionsResponse:
        if not request.tenant or not request.node_id:
            raise InvalidArgumentError("tenant and node_id are required")
        granted, limit = await self._subscriptions.hold(
            request.tenant, request.node_id, request.held, request.amount
        )
        return pb.HoldSubscriptionsResponse(granted=granted, limit=limit)

    async def AcquireLease(
        self, request: pb.AcquireLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireLeaseResponse:
        res = request.resource
        field = _RATE_RESOURCES.get(res) or _TOTAL_RESOURCES.get(res)
        if field is None:
            known = sorted([*_RATE_RESOURCES, *_TOTAL_RESOURCES])
            raise InvalidArgumentError(f"unknown resource {res!r}; expected one of {known}")
        tenant_argument(request.tenant)
        scope = _scope(request.tenant, request.user)
        ttl_ms = self._ttl
        now_ms = time.time_ns() // 1_000_000
        horizon_ms = 0
        if res in _RATE_RESOURCES:
            # The budget of the current one-second window: a grant is good until it ends.
            key = f"{scope}:{res}:{now_ms // 1000}"
            counter_ttl = 2000
            ttl_ms = 1000 - now_ms % 1000
            horizon_ms = self._horizon_ms
        else:
            key = f"{scope}:{res}"
            counter_ttl = 0
        granted, limit, nodes = await self._script(
            keys=[limits_key(request.tenant, request.user), key, f"{scope}:{res}:nodes"],
            args=[field, request.amount, counter_ttl, request.node_id, now_ms, horizon_ms],
        )
        result = pb.LEASE_RESULT_GRANTED if granted > 0 else pb.LEASE_RESULT_EXCEED_LIMIT
        return pb.AcquireLeaseResponse(
            result=result, granted=int(granted), ttl_ms=ttl_ms, limit=int(limit), nodes=int(nodes)
        )

    async def ListBans(
        self, request: pb.ListBansRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListBansResponse:
        return await self._bans.list()

    async def AddBan(
        self, request: pb.AddBanRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddBanResponse:
        return await self._bans.add(request, "mesh")

    async def GetLimits(
        self, request: pb.GetLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLimitsResponse:
        return await get_limits(self._redis, request)
