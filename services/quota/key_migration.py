"""Moves tenant limits written before the Redis Cluster key layout (`st:quota:T:limits`,
`st:quota:T:u:U:limits`) to their tagged keys (`st:quota:{T}:limits`, services/common/quota_keys.py)
when the quota service starts, so an upgrade keeps every limit an operator set. A tagged key
that already exists wins: it was written by the new code, after the old one."""

from __future__ import annotations

import logging
from typing import Any

from services.common.quota_keys import limits_key
from services.common.tenant_name import TENANT_NAME

log = logging.getLogger("starling.quota.keys")

PREFIX, SUFFIX = "st:quota:", ":limits"


def tagged_key(old: str) -> str | None:
    """The tagged key of an old-layout limits key, or None for a key of another shape."""
    if not (old.startswith(PREFIX) and old.endswith(SUFFIX)) or "{" in old:
        return None
    middle = old[len(PREFIX) : -len(SUFFIX)]
    tenant, _, user = middle.partition(":u:")
    if not TENANT_NAME.fullmatch(tenant) or (":u:" in middle and not user):
        return None
    return limits_key(tenant, user)


async def migrate_limit_keys(redis: Any) -> int:
    """Move every old-layout limits hash; return how many were moved."""
    moved = 0
    async for raw in redis.scan_iter(match=f"{PREFIX}*{SUFFIX}", count=500):
        old = raw.decode() if isinstance(raw, bytes) else str(raw)
        new = tagged_key(old)
        if new is None:
            continue
        values = await redis.hgetall(old)
        if values and not await redis.exists(new):
            await redis.hset(new, mapping=values)
            moved += 1
        await redis.delete(old)
    if moved:
        log.info("quota_limit_keys_moved %s", moved)
    return moved
