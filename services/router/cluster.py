"""A router among several instances (`instance_count` > 1): what keeps each instance's
in-memory state exact while the others change it, and who fires delayed messages.

Every instance can route any message: each holds the whole route table, the retained index
and the delayed schedule, loaded from the store at start, and writes through to the store.
What another instance changed reaches it as follows.

- **Route table** (`RouteReplay`): the store's event log is the order of changes. An
  instance routes with its table's version, checked by the queue like a node's copy
  (services/router/fencing.py); a refusal, or a change of its own, makes it read the
  tenant's route events after the last one it applied. A change is written to the store
  *before* its version is fenced, so a version an instance reads from the queues never
  stands for a change its replay could miss.
- **Retained messages and delayed publishes** (`Generations`): a counter in Redis per
  tenant (retained) and one for all delayed messages, bumped after every store write. An
  instance trusts its memory only while the counter is the one it last saw (a GET before
  each retained lookup and cap check, and each scheduler turn); else it reloads from the
  store. Redis lost: the counters restart and every instance reloads once.
- **Firing delayed messages** (`Lease`): only the holder of a Redis lease (renewed every
  scheduler turn, `LEASE_MS` long) fires; another instance takes over within `LEASE_MS` of
  the holder's death. Firing stays at least once (as on one instance: published, then
  deleted); a persistent queue drops the repeat by message id.
"""

from __future__ import annotations

import time
from typing import Any

from services.common.route_table import RouteTable, SessionKey
from services.common.store.eventlog import LoggedSessionStore
from services.router.boot import GAP_TRIES, PAGE, BootReport, apply, gap, reload_tenant
from services.router.copies import TablePositions

PREFIX = "starling:router:"
LEASE_MS = 1500  # a dead scheduler's delayed messages fire at most this late (plus a turn)
DELAYED = "delayed"

# Take the lease if free, renew it if ours: 1 when we hold it.
_HOLD = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""


class RouteReplay:
    """Applies a tenant's route events from the store that this instance has not applied
    yet (boot.py's replay, one tenant at a time, from where it last stopped)."""

    def __init__(
        self,
        store: LoggedSessionStore,
        table: RouteTable,
        boot: BootReport,
        table_positions: TablePositions | None = None,
    ) -> None:
        self._store = store
        self._table = table
        # A stable position: a tenant with no event applied above it continues from it
        # along its chain (services/router/boot.py).
        self._default = boot.position
        self._positions = dict(boot.tenant_positions)
        # Told what the table now holds, so a node's copy is built up to it (copies.py).
        self._table_positions = table_positions

    async def replay(self, tenant: str, mine: set[SessionKey] | None = None) -> bool:
        """Apply the tenant's new route events; True when any concerned a session not in
        `mine` (another instance changed the table; `mine` None: any event counts). When
        pruning took events this instance had not applied (it was paused, or idle in the
        tenant, past a compaction), the tenant is reloaded from the snapshot first
        (services/router/boot.py `gap`)."""
        after = self._positions.get(tenant, self._default)
        foreign = False
        for _ in range(GAP_TRIES):
            start = after
            while True:
                events = await self._store.read_events(after, PAGE, tenant)
                for e in events:
                    apply(self._table, e)
                    foreign |= mine is None or (e.client_id, e.incarnation) not in mine
                if events:
                    after = events[-1].position
                if len(events) < PAGE:
                    break
            if not await gap(self._store, tenant, start):
                break
            after = await reload_tenant(self._store, self._table, tenant)
            foreign = True
        else:
            raise RuntimeError(f"the log of {tenant!r} was pruned {GAP_TRIES} times in a row")
        self._positions[tenant] = after
        if self._table_positions is not None:
            self._table_positions.logged(tenant, after)
        return foreign


class Generations:
    """Counters in Redis that tell an instance its copy of a shared piece of state is no
    longer the store's (module docstring). Keys: `retained:<tenant>`, `delayed`."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._known: dict[str, int] = {}

    async def wrote(self, key: str) -> None:
        """After our store write: our copy stays trusted only if no other instance wrote
        since we last looked."""
        g = int(await self._redis.incr(PREFIX + key))
        self._known[key] = g if self._known.get(key) == g - 1 else -1

    async def stale(self, key: str) -> int | None:
        """None when our copy is current; else the generation to `adopt` once reloaded
        (read before the reload, so a write during it leaves us stale, not wrong)."""
        g = int(await self._redis.get(PREFIX + key) or 0)
        return None if self._known.get(key) == g else g

    def adopt(self, key: str, generation: int) -> None:
        self._known[key] = generation


class Lease:
    """One holder at a time among the instances (Redis key with a TTL, renewed by its
    holder). `held()` is true only while the lease was renewed less than a TTL ago, less a
    margin for the clock of the Redis round trip."""

    def __init__(self, redis: Any, name: str, holder: str, ttl_ms: int = LEASE_MS) -> None:
        self._redis = redis
        self._key = PREFIX + "lease:" + name
        self._holder = holder
        self._ttl_ms = ttl_ms
        self._until = 0.0

    async def renew(self) -> bool:
        started = time.monotonic()
        got = await self._redis.eval(_HOLD, 1, self._key, self._holder, self._ttl_ms)
        self._until = started + self._ttl_ms / 1000 * 0.8 if got == 1 else 0.0
        return self.held()

    def held(self) -> bool:
        return time.monotonic() < self._until


class Shared:
    """What a router of several instances shares (None on a single instance)."""

    def __init__(self, redis: Any, holder: str) -> None:
        self.redis = redis
        self.generations = Generations(redis)
        self.scheduler = Lease(redis, "scheduler", holder)

    async def close(self) -> None:
        await self.redis.aclose()
