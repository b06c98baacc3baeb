"""The overview's samples in Redis, so that every console replica draws the same charts: one
sorted set for the cluster and one per tenant, scored by the sample's time, trimmed to the
last `span_s` seconds on every write and expiring with it (a tenant that stops reporting
leaves nothing behind). Only one replica takes each sample: the first to claim the slot.

Keys: `console:hist:cluster`, `console:hist:tenant:<tenant>`, `console:hist:slot:<n>`.
Losing them loses only the charts' past (Redis holds what may be lost)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from services.console.series import (
    ClusterSample,
    TenantSample,
    decode_cluster,
    decode_tenant,
    encode_cluster,
    encode_tenant,
)

PREFIX = "console:hist:"
CLUSTER = PREFIX + "cluster"


def tenant_key(tenant: str) -> str:
    return f"{PREFIX}tenant:{tenant}"


@dataclass(frozen=True, slots=True, kw_only=True)
class History:
    redis: Redis
    span_s: int  # how far back samples are kept (the charts' width)

    async def claim(self, slot: int, ttl_s: float) -> bool:
        """True for the one replica that takes sample number `slot`."""
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(await self.redis.set(f"{PREFIX}slot:{slot}", b"1", nx=True, px=ttl_ms))

    async def add(self, cluster: ClusterSample, tenants: Mapping[str, TenantSample]) -> None:
        oldest = cluster.at_ms - self.span_s * 1000
        keep_s = self.span_s + 60
        pipe = self.redis.pipeline(transaction=False)
        entries = [(CLUSTER, encode_cluster(cluster), cluster.at_ms)]
        entries += [(tenant_key(t), encode_tenant(s), s.at_ms) for t, s in tenants.items()]
        for key, member, score in entries:
            pipe.zadd(key, {member: score})
            pipe.zremrangebyscore(key, "-inf", f"({oldest}")
            pipe.expire(key, keep_s)
        await pipe.execute()

    async def cluster(self) -> list[ClusterSample]:
        """The cluster's samples, oldest first."""
        raws = await self.redis.zrange(CLUSTER, 0, -1)
        return [decode_cluster(cast(bytes, raw)) for raw in raws]

    async def tenant(self, tenant: str) -> list[TenantSample]:
        """One tenant's samples, oldest first."""
        raws = await self.redis.zrange(tenant_key(tenant), 0, -1)
        return [decode_tenant(cast(bytes, raw)) for raw in raws]

    async def latest(self, tenants: Sequence[str]) -> dict[str, list[TenantSample]]:
        """The two newest samples of each tenant (enough for its current rates)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in tenants:
            pipe.zrange(tenant_key(t), -2, -1)
        answers = await pipe.execute()
        return {
            t: [decode_tenant(raw) for raw in got] for t, got in zip(tenants, answers, strict=True)
        }
