"""Leases on queue partitions, in Redis: which live instance may claim which partition.

A lease is liveness, not safety. Safety is the fencing epoch in the store: an instance writes
to a partition only with the epoch its claim took, and the store refuses an older one, so two
instances that both believe they hold a partition (a Redis restart, a pause longer than the
lease) cost refused appends, never a lost or reordered entry.

Theory of operation: every instance runs `LeaseTable.tick` every `lease_ttl_ms / 4`. One Lua
script (one round trip, atomic) registers the instance as a member until now + ttl, forgets
members whose time ran out, renews the instance's leases, and takes free partitions up to its
fair share (ceil(partitions / live members)). An instance that holds more than its share is
told so and gives the excess up gracefully (`release`, after services/queue/ownership.py
stopped appending to them). So a dead
instance's partitions are free one ttl after its last renewal and taken at the next tick of
another instance; a new instance gets its share as the others shed theirs. Time is Redis's
(TIME), so the hosts' clocks do not matter.

If Redis data is lost, leases are taken again at the next tick (an instance first renews what
it holds); while Redis is unreachable, an instance keeps what it holds (its epochs still
fence it) and takes nothing new.

Redis Cluster: the script names every key it touches (the members set and each partition's
lease) and they share the hash tag `{q}`, so it runs on one slot: `<prefix>{q}members`,
`<prefix>lease:{q}<partition>` (a prefix must not contain braces).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PREFIX = "starling:queue:"

# KEYS: the members set, then the lease of each partition 0..n-1 (one slot: tag `{q}`).
# ARGV: instance, ttl_ms. Returns {share, live members, owned...}.
_TICK = """
local me, ttl = ARGV[1], tonumber(ARGV[2])
local n = #KEYS - 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = KEYS[1]
redis.call('ZADD', members, now + ttl, me)
redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
local live = redis.call('ZCARD', members)
local owned, free = {}, {}
for p = 0, n - 1 do
  local k = KEYS[p + 2]
  local v = redis.call('GET', k)
  if v == me then
    redis.call('PEXPIRE', k, ttl)
    owned[#owned + 1] = p
  elseif not v then
    free[#free + 1] = p
  end
end
local share = math.ceil(n / live)
-- Start at a point of the ring that differs by instance, so that instances taking free
-- partitions at once mostly take different ones.
local start = #free > 0 and (redis.sha1hex(me):byte(1) % #free) or 0
for i = 0, #free - 1 do
  if #owned >= share then break end
  local p = free[(start + i) % #free + 1]
  redis.call('SET', KEYS[p + 2], me, 'PX', ttl)
  owned[#owned + 1] = p
end
local out = {share, live}
for i = 1, #owned do out[#out + 1] = owned[i] end
return out
"""

# KEYS: the lease. ARGV: instance.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class LeaseView:
    owned: frozenset[int]  # partitions whose lease this instance holds now
    share: int  # how many it should hold (ceil(partitions / live members))
    members: int  # live instances


class LeaseTable:
    def __init__(
        self, redis: Any, instance_id: str, partitions: int, ttl_ms: int, prefix: str = PREFIX
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._id = instance_id
        self._ttl_ms = ttl_ms
        self._tick = redis.register_script(_TICK)
        self._release = redis.register_script(_RELEASE)
        self._members = f"{prefix}{{q}}members"
        self._keys = [self._members, *(self._lease_key(p) for p in range(partitions))]

    def _lease_key(self, partition: int) -> str:
        return f"{self._prefix}lease:{{q}}{partition}"

    async def tick(self) -> LeaseView:
        """Renew this instance's leases, take free partitions up to its fair share."""
        out = await self._tick(keys=self._keys, args=[self._id, self._ttl_ms])
        share, members, *owned = (int(v) for v in out)
        return LeaseView(frozenset(owned), share, members)

    async def release(self, partitions: Iterable[int]) -> None:
        """Give these leases up now (a graceful stop: the others need not wait for expiry)."""
        for p in partitions:
            await self._release(keys=[self._lease_key(p)], args=[self._id])

    async def leave(self) -> None:
        await self._redis.zrem(self._members, self._id)
