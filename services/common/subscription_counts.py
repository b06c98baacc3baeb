"""SubscriptionCounts: the tenant-wide subscription count (a tenant's
`max_tenant_subscriptions`), in Redis. Its users share the Redis keys, not a service: the
connection nodes ask for slots (services/connection/subscription_slots.py), the session
service drops a dead node's figures (services/session/liveness.py) and the quota service
reports a tenant's total (services/quota/api.py).

Theory of operation: each connection node is the authority on the subscriptions its clients
hold (its trie), and the count per tenant is a Redis hash node id -> what that node holds.
A node reports its figure as an absolute value on every call (so a lost or repeated call is
corrected by the next one), and asks for slots for a SUBSCRIBE's new filters in the same
atomic step: the script writes the node's figure, sums the tenant's hash and grants what
fits below the limit. The nodes' figures never fall below what they hold, so the cluster
never grants past the limit (a node's figure can be high for a moment: filters it is still
adding, or releases it has not reported yet). A node that dies leaves its figure behind until
the session service declares it dead (`drop_node`, from the node's set of tenants), or it
restarts (its hello does the same). Offline persistent sessions hold their subscriptions in
the router, not on a node: they are not counted (docs/quota.md states the bound).

Redis Cluster: the script touches the tenant's keys only (hash tag `{tenant}`, one slot);
the node's set of tenants lives in another slot, so it is written by its own command just
before the script, whenever the script may give the node a figure: a node's figure in a
tenant's hash is always listed in its set (a listed tenant without a figure costs `drop_node`
one HDEL of nothing).
"""

from __future__ import annotations

from redis.asyncio import Redis

from services.common.quota_keys import limits_key, scope

# KEYS (the tenant's slot): the tenant's limits hash, its subscription hash.
# ARGV: node id, held (the node's figure before this call's new filters), amount (new
# filters asking for slots; 0: only report held). Returns {granted, limit}.
_HOLD = """
local held = tonumber(ARGV[2]); local amount = tonumber(ARGV[3])
if held > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], held)
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
if amount <= 0 then return {0, 0} end
local limit = tonumber(redis.call('HGET', KEYS[1], 'max_tenant_subscriptions') or '0')
local grant = amount
if limit > 0 then
  local total = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
  grant = math.max(0, math.min(amount, limit - total))
end
if grant > 0 then redis.call('HINCRBY', KEYS[2], ARGV[1], grant) end
return {grant, limit}
"""


def subscriptions_key(tenant: str) -> str:
    """The hash node id -> subscriptions its clients of `tenant` hold."""
    return f"{scope(tenant)}:subscriptions"


def node_tenants_key(node_id: str) -> str:
    """The set of tenants whose subscription hash has a figure of `node_id`."""
    return f"st:quota:node:{node_id}:subscriptions"


class SubscriptionCounts:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._hold = redis.register_script(_HOLD)

    async def hold(self, tenant: str, node_id: str, held: int, amount: int) -> tuple[int, int]:
        """Record `held` as the node's figure and grant up to `amount` more below the
        tenant's limit; returns (granted, limit; 0: none)."""
        if held > 0 or amount > 0:  # the script may give the node a figure
            await self._redis.sadd(node_tenants_key(node_id), tenant)
        granted, limit = await self._hold(
            keys=[limits_key(tenant), subscriptions_key(tenant)], args=[node_id, held, amount]
        )
        return int(granted), int(limit)

    async def total(self, tenant: str) -> int:
        """The tenant's subscriptions as the nodes reported them."""
        values = await self._redis.hvals(subscriptions_key(tenant))
        return sum(int(v) for v in values)

    async def drop_node(self, node_id: str) -> None:
        """A node died or restarted: it holds nothing any more."""
        key = node_tenants_key(node_id)
        tenants = await self._redis.smembers(key)
        if tenants:
            pipe = self._redis.pipeline(transaction=False)
            for t in tenants:
                pipe.hdel(subscriptions_key(t.decode() if isinstance(t, bytes) else t), node_id)
            await pipe.execute()
        await self._redis.delete(key)
