"""The session registry's Redis keys, laid out for Redis Cluster, and the index of tenants
that have registry keys (`TenantIndex`).

Key layout: everything a CONNECT's claim script touches carries the tenant as its hash tag
(`{tenant}`), so the script runs on one slot of a cluster: the tenant's hash of connections,
its connections per user, its session set, its generation sentinel, the node sets of its
clients (`st:node:{tenant}:<node>:clients`, and `st:nodes:{tenant}`: nodes that hold its
clients), and the quota service's limits hashes (services/common/quota_keys.py, same tag). On one
Redis the braces are only characters of the names.

What is not per tenant lives under the tag `{st:registry}`: the global generation sentinel
(`GENERATION`) and the set of tenants (`TENANTS`), which node liveness walks to find a node's
clients (services/session/liveness.py) and the generation check walks to find each tenant's
sentinel. Each tenant's sentinel sits in its own slot, so a cluster shard that loses its data
alone (a primary restarted empty) is noticed by the claims and the check of the tenants it
held, and the global one by the check of `{st:registry}`'s shard.

Index invariant: a tenant with registry keys is in `TENANTS`, up to a loss of that set's
shard, which the global sentinel reports (and the re-assertion that follows re-adds every
tenant, because a re-assertion always writes its tenant into the set). A CONNECT adds its
tenant before its claim, once per instance and global generation (a cache), so the CONNECT
path pays the extra round trip only for a tenant's first CONNECT.
"""

from __future__ import annotations

import uuid
from typing import Any

from services.common.quota_keys import limits_key

GENERATION = "{st:registry}:generation"  # global sentinel: gone means its shard was lost
TENANTS = "{st:registry}:tenants"  # tenants that have registry keys
# KEYS[1] TENANTS, KEYS[2] GENERATION (one slot); ARGV[1] a tenant. The global generation
# when the tenant is not in the index yet and that generation is there; else nothing.
_NEW_TENANT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return false end
return redis.call('GET', KEYS[2])
"""


def tag(tenant: str) -> str:
    """The hash tag of a tenant's keys (tenant names are [A-Za-z0-9_-]: no braces)."""
    return "{" + tenant + "}"


def clients_key(tenant: str) -> str:
    """Hash client id -> holder JSON: the tenant's connections."""
    return f"st:clients:{tag(tenant)}"


def users_key(tenant: str) -> str:
    """Hash user -> connections of the tenant's user."""
    return f"st:clients:{tag(tenant)}:users"


def sessions_key(tenant: str) -> str:
    """The set of the tenant's client ids that have a persistent session (max_sessions)."""
    return f"st:sessions:{tag(tenant)}"


def generation_key(tenant: str) -> str:
    """The tenant's generation sentinel (in the slot of its other keys)."""
    return f"st:registry:{tag(tenant)}:generation"


def node_clients_key(tenant: str, node_id: str) -> str:
    """The set of the tenant's client ids that `node_id` holds."""
    return f"st:node:{tag(tenant)}:{node_id}:clients"


def tenant_nodes_key(tenant: str) -> str:
    """The set of nodes that hold (or held) clients of the tenant."""
    return f"st:nodes:{tag(tenant)}"


def claim_keys(tenant: str, node_id: str, user: str) -> list[str]:
    """KEYS of the claim script (services/session/registry.py `_CLAIM`), all in the tenant's
    slot."""
    return [
        clients_key(tenant),
        generation_key(tenant),
        node_clients_key(tenant, node_id),
        tenant_nodes_key(tenant),
        limits_key(tenant),
        users_key(tenant),
        limits_key(tenant, user),
        sessions_key(tenant),
    ]


def release_keys(tenant: str, node_id: str) -> list[str]:
    """KEYS of the release script (`_RELEASE`): no node ("") names the tenant hash again."""
    node = node_clients_key(tenant, node_id) if node_id else clients_key(tenant)
    return [clients_key(tenant), node, users_key(tenant)]


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class TenantIndex:
    """The tenants that have registry keys (`TENANTS`), with this instance's cache of those
    it added under the global generation it last saw."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._new_tenant = redis.register_script(_NEW_TENANT)
        self._added: set[str] = set()
        self._generation = ""  # the global sentinel's value when `_added` was filled

    async def add(self, tenant: str, always: bool = False) -> None:
        """Make sure `tenant` is in the index (`always`: even if this instance added it).

        A tenant new to the index (and a registry that knows its generation) gets its
        sentinel first, holding the global generation: a first CONNECT is not a lost
        registry, and never makes every node re-assert what it holds. A tenant the index
        lost lost the global sentinel with it (one slot), so no seed hides that loss."""
        if always or tenant not in self._added:
            generation = await self._new_tenant(keys=[TENANTS, GENERATION], args=[tenant])
            if generation:
                await self._redis.set(generation_key(tenant), generation, nx=True)
            await self._redis.sadd(TENANTS, tenant)
            self._added.add(tenant)

    async def tenants(self) -> list[str]:
        """Every tenant in the index (and those this instance added, should the set's shard
        have lost them since)."""
        raw = await self._redis.smembers(TENANTS)
        return sorted({_text(t) for t in raw} | self._added)

    async def check(self) -> str | None:
        """Write a new generation where a sentinel is missing (the global one, or a tenant's):
        returns it then (the nodes must re-assert what they hold), None when none was."""
        generation = uuid.uuid4().hex
        fresh = None
        if await self._redis.set(GENERATION, generation, nx=True):
            fresh = generation
        current = _text(await self._redis.get(GENERATION) or b"")
        if current != self._generation:  # another instance (or this one) found a loss
            self._added.clear()
            self._generation = current
        tenants = await self.tenants()
        if tenants:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.set(generation_key(tenant), generation, nx=True)
                written = await pipe.execute()
            if any(written):
                fresh = generation
        return fresh

    async def union(self, key_of: Any) -> list[tuple[str, list[str]]]:
        """(tenant, members of the set `key_of(tenant)`) for every tenant whose set has
        any, read in one pipeline."""
        tenants = await self.tenants()
        if not tenants:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.smembers(key_of(tenant))
            replies = await pipe.execute()
        return [
            (tenant, sorted(_text(m) for m in members))
            for tenant, members in zip(tenants, replies, strict=True)
            if members
        ]
