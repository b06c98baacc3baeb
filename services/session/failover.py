"""Notice that another Redis server became the primary, and treat it as a lost registry.

A Sentinel (or cluster) failover promotes a replica, and a replica lags: the claims, releases
and counts written after its last sync are gone, while the older keys, the registry's
generation sentinel (`st:registry:generation`, services/session/registry.py) among them, are
still there. The sentinel check alone would miss that loss, and a client whose claim was lost
could then hold a connection on two nodes. A Redis restarted from an older snapshot is the
same case.

So the registry also records which server it lives on: `st:registry:primary` holds the
primary's identity (its `run_id`, services/common/redis_client.py `server_identity`; a new
process or a promoted replica has another one). The session service's check every second
(services/session/fence.py `watch_generation`) compares it with the server answering now;
when they differ it records the new one (a compare-and-set: of several session instances one
wins) and the winner asks every node to re-assert its connections, exactly as when Redis lost
its data: the later epoch of a client id keeps its connection, the other is kicked (0x8E).
A missing record with the sentinel present is a first start of this check, not a loss.
"""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from services.common.redis_client import server_identity

PRIMARY = "st:registry:primary"

# KEYS: the primary record. ARGV: the identity of the server answering now.
# Returns 0 unchanged, 1 another primary was recorded (now replaced), 2 none was recorded.
_ADOPT = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
if cur then return 1 end
return 2
"""


class PrimaryWatch:
    """The registry's record of its primary (see the module's docstring)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._adopt = redis.register_script(_ADOPT)

    async def check(self) -> str | None:
        """A new generation name when the primary changed since the record (the caller
        announces the loss), else None."""
        identity = await server_identity(self._redis)
        if not identity:
            return None
        changed = await self._adopt(keys=[PRIMARY], args=[identity])
        if int(changed) == 1:
            return "primary-" + uuid.uuid4().hex
        return None
