"""gRPC servicers of the quota service over Redis hashes and window counters."""

from __future__ import annotations

import time

import grpc
from redis.asyncio import Redis

from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc

_FIELDS = [f.name for f in pb.Limits.DESCRIPTOR.fields]
# Resources counted per second window; the rest are totals.
_RATE_RESOURCES = {
    "messages_per_s": "max_messages_per_s",
    "bytes_in_per_s": "max_bytes_in_per_s",
    "bytes_out_per_s": "max_bytes_out_per_s",
}
_TOTAL_RESOURCES = {"connections": "max_connections", "sessions": "max_sessions"}

# Grant min(amount, limit - used) atomically; 0 limit means unlimited.
_LEASE = """
local limit = tonumber(ARGV[1]); local amount = tonumber(ARGV[2]); local ttl = tonumber(ARGV[3])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local grant = amount
if limit > 0 then grant = math.max(0, math.min(amount, limit - used)) end
if grant > 0 then
  redis.call('INCRBY', KEYS[1], grant)
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
end
return grant
"""


def _limits_key(tenant: str) -> str:
    return f"st:quota:{tenant}:limits"


class QuotaAdminApi(pb_grpc.QuotaAdminServiceServicer):
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def SetLimits(
        self, request: pb.SetLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetLimitsResponse:
        if not request.tenant:
            raise ValueError("tenant is required")
        mapping = {name: getattr(request.limits, name) for name in _FIELDS}
        await self._redis.hset(_limits_key(request.tenant), mapping=mapping)  # type: ignore[misc]
        return pb.SetLimitsResponse()

    async def GetLimits(
        self, request: pb.GetLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLimitsResponse:
        raw = await self._redis.hgetall(_limits_key(request.tenant))  # type: ignore[misc]
        values = {k.decode(): int(v) for k, v in raw.items() if k.decode() in _FIELDS}
        return pb.GetLimitsResponse(limits=pb.Limits(**values))


class QuotaApi(pb_grpc.QuotaServiceServicer):
    def __init__(self, redis: Redis, lease_ttl_ms: int) -> None:
        self._redis = redis
        self._ttl = lease_ttl_ms
        self._script = redis.register_script(_LEASE)

    async def AcquireLease(
        self, request: pb.AcquireLeaseRequest, context: grpc.aio.ServicerContext
    ) -> pb.AcquireLeaseResponse:
        res = request.resource
        field = _RATE_RESOURCES.get(res) or _TOTAL_RESOURCES.get(res)
        if field is None:
            known = sorted([*_RATE_RESOURCES, *_TOTAL_RESOURCES])
            raise ValueError(f"unknown resource {res!r}; expected one of {known}")
        raw = await self._redis.hget(_limits_key(request.tenant), field)  # type: ignore[misc]
        limit = int(raw or 0)
        if res in _RATE_RESOURCES:
            key = f"st:quota:{request.tenant}:{res}:{int(time.time())}"
            ttl = 2000
        else:
            key = f"st:quota:{request.tenant}:{res}"
            ttl = 0
        granted = int(await self._script(keys=[key], args=[limit, request.amount, ttl]))
        result = pb.LEASE_RESULT_GRANTED if granted > 0 else pb.LEASE_RESULT_EXCEED_LIMIT
        return pb.AcquireLeaseResponse(result=result, granted=granted, ttl_ms=self._ttl)
