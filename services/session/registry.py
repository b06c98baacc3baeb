"""Session registry in Redis: which node holds which client, with a registry epoch.

Theory of operation: an epoch is time-ordered, max(now in microseconds, installed epoch + 1),
so it keeps growing without any counter in Redis: after Redis loses its data a new CONNECT
still gets an epoch above every connection alive before the loss (no `st:epoch:*` key per
client id either). `claim` installs (node, epoch) atomically (Lua) unless a higher epoch is
installed; a CONNECT whose epoch is not above the installed one (clocks of two session
services apart) is retried just above it, because the CONNECT being answered is the latest.
Of two racing CONNECTs the later one ends installed and the earlier one is kicked (or learns
it lost), so exactly one connection survives. `release` removes the entry only for the epoch
that owns it. The tenant's hash has one entry per connected client id, so its length is the
tenant's connection count mesh-wide: `claim` refuses a new client id, in the same atomic
step, when the tenant is at its cap (taking over a client id already connected never adds one),
and one whose installed connection is another user's; the same step records which node holds
the client: a CONNECT costs one Redis round trip. The same step keeps two more quota counts
exact mesh-wide: connections per user (a hash user -> count, for a user's `max_connections`)
and the tenant's client ids with a persistent session, online or offline (a set, for
`max_sessions`: joined by the CONNECT that opens the session, left when services/session/
sessions.py discards it).

Every key of a claim carries the tenant's hash tag, so the script touches one slot of a Redis
Cluster; services/session/registry_keys.py has the layout, and the index of tenants through
which node liveness finds a node's clients (`held_by`, `known_nodes`).

Losing Redis (restart without persistence, FLUSHALL, failover to an empty replica, one cluster
shard restarted empty) empties the registry, or a part of it; the generation sentinels go with
it: the global one (`{st:registry}:generation`) and each tenant's, in its slot. Whoever
finds one missing (`claim`, or `check_generation` every second) writes a new generation and
the session service asks every node to re-assert the connections it holds (`reclaim`, the
same later-epoch-wins claim, never refused by the cap): the registry is rebuilt, and a client
that connected to another node meanwhile keeps the later connection while the earlier one is
kicked.
Redis holds only what may be lost: losing it drops the registry, never a message. The
per-user counts come back with the re-asserted connections; the session set comes back as
sessions reconnect (until then the tenant may open more than `max_sessions`).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, fields, replace

from redis.asyncio import Redis

from services.session.pipelined import PipelinedScript
from services.session.registry_keys import (
    GENERATION,
    TenantIndex,
    claim_keys,
    clients_key,
    node_clients_key,
    release_keys,
    sessions_key,
    tenant_nodes_key,
    users_key,
)

__all__ = ["GENERATION", "ClaimResult", "Holder", "Registry", "sessions_key"]

# One round trip per CONNECT: the owner check of the installed connection, the claim (within
# the tenant's and the user's connection caps and the tenant's session cap), and which node
# holds the client, in one atomic script.
# KEYS (one slot: the tenant's hash tag): tenant hash, the tenant's generation sentinel, the
# node's set of the tenant's clients, the set of nodes holding the tenant's clients, the
# tenant's limits hash of the quota service (its `max_connections`, 0 or absent: none, caps
# the tenant too, the lower cap wins; its `max_sessions`), the tenant's connections per user
# (hash user -> count), the user's limits hash (its `max_connections`), the tenant's set of
# client ids with a persistent session.
# ARGV: client id, epoch, holder JSON, cap, mode ('connect': an installed epoch at or above
# ours asks for a higher one; 'reclaim': only a higher installed epoch refuses ours, an equal
# one is this connection's entry, kept as it is), new generation, owner of the claim, '1' to
# refuse a client id whose installed connection belongs to another owner (its JSON `owner`;
# null: unknown, anyone may), member of the node's set (the client id), node id, user name
# ('' none: not counted per user), '1' when the CONNECT opens or keeps a persistent session
# (the client id joins the session set unless the tenant is at `max_sessions`).
# Epochs are microseconds (< 2^53): exact as Lua numbers.
# Returns {code, previous holder JSON, generation written ('' if the sentinel was there)};
# code 0 refused, 1 installed, 2 tenant at its cap (the cap in the second slot), 3 retry
# above the installed epoch, 4 the installed connection is another owner's, 5 the user at its
# connection cap, 6 the tenant at its session cap (the cap in the second slot).
_CLAIM = """
local fresh = ''
if redis.call('SET', KEYS[2], ARGV[6], 'NX') then fresh = ARGV[6] end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local install = true
local connect = ARGV[5] == 'connect'
local user = ARGV[11]
local old_user = false
if cur then
  local h = cjson.decode(cur)
  if ARGV[8] == '1' then
    local o = h['owner']
    if o ~= nil and o ~= cjson.null and o ~= ARGV[7] then return {4, cur, fresh} end
  end
  local installed = tonumber(h['epoch'])
  local mine = tonumber(ARGV[2])
  if connect then
    if installed >= mine then return {3, cur, fresh} end
  elseif installed > mine then return {0, cur, fresh}
  elseif installed == mine then install = false end
  old_user = h['username'] or ''
else
  local cap = tonumber(ARGV[4])
  if connect then
    local q = tonumber(redis.call('HGET', KEYS[5], 'max_connections') or '0') or 0
    if q > 0 and (cap <= 0 or q < cap) then cap = q end
  end
  if cap > 0 and redis.call('HLEN', KEYS[1]) >= cap then return {2, tostring(cap), fresh} end
end
local moves = install and old_user ~= user
if connect and moves and user ~= '' then
  local ucap = tonumber(redis.call('HGET', KEYS[7], 'max_connections') or '0') or 0
  if ucap > 0 and (tonumber(redis.call('HGET', KEYS[6], user) or '0') or 0) >= ucap then
    return {5, tostring(ucap), fresh}
  end
end
if connect and ARGV[12] == '1' and redis.call('SISMEMBER', KEYS[8], ARGV[1]) == 0 then
  local scap = tonumber(redis.call('HGET', KEYS[5], 'max_sessions') or '0') or 0
  if scap > 0 and redis.call('SCARD', KEYS[8]) >= scap then return {6, tostring(scap), fresh} end
  redis.call('SADD', KEYS[8], ARGV[1])
end
if install then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
if moves then
  if old_user and old_user ~= '' then
    if redis.call('HINCRBY', KEYS[6], old_user, -1) <= 0 then
      redis.call('HDEL', KEYS[6], old_user)
    end
  end
  if user ~= '' then redis.call('HINCRBY', KEYS[6], user, 1) end
end
redis.call('SADD', KEYS[3], ARGV[9])
redis.call('SADD', KEYS[4], ARGV[10])
return {1, cur or '', fresh}
"""

# KEYS (the tenant's slot): tenant hash, the node's set of the tenant's clients (or the tenant
# hash again: no node), the tenant's connections per user.
# ARGV: client id, epoch, member of the node's set ('' none).
# Returns 1 removed, 0 a connection of another epoch is installed, -1 none at all.
_RELEASE = """
if ARGV[3] ~= '' then redis.call('SREM', KEYS[2], ARGV[3]) end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
local h = cjson.decode(cur)
if tonumber(h['epoch']) == tonumber(ARGV[2]) then
  redis.call('HDEL', KEYS[1], ARGV[1])
  local u = h['username'] or ''
  if u ~= '' and redis.call('HINCRBY', KEYS[3], u, -1) <= 0 then redis.call('HDEL', KEYS[3], u) end
  return 1
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Holder:
    tenant: str
    client_id: str
    node_id: str
    epoch: int
    username: str = ""
    peer_address: str = ""
    protocol_level: int = 4
    connected_at_ms: int = 0
    clean_start: bool = True
    # Who the connection authenticated as ("" anonymous; None: unknown, an entry written
    # before owners were recorded).
    owner: str | None = None
    # The connection's will (base64 of its envelope, "" none) and Will Delay Interval, for
    # the session service to publish if the node dies (services/session/wills.py).
    will: str = ""
    will_delay_s: int = 0


@dataclass(frozen=True, slots=True)
class ClaimResult:
    won: bool
    previous: Holder | None
    full: bool = False  # refused: a new client id and the tenant at its connection cap
    cap: int = 0  # the cap that refused it (the setting's or the quota service's limit)
    # refused by a quota of the quota service other than the tenant's connections:
    # "max_connections_per_user" or "max_sessions" (`cap` is the limit)
    quota: str = ""
    # refused: the installed connection belongs to another owner (nothing was installed)
    not_owner: bool = False
    epoch: int = 0  # the epoch installed (a CONNECT's may be above the one it asked for)
    # The registry had been lost (its sentinel was missing): the new generation written; the
    # nodes must re-assert what they hold. "" when the registry was the one we knew.
    generation: str = ""


MAX_CLAIM_TRIES = 8  # retries above a higher installed epoch (only clock skew causes them)


def _decode(raw: bytes | str) -> Holder:
    data = json.loads(raw)
    try:
        return Holder(**data)
    except TypeError:  # fields this version does not know (a newer writer, in an upgrade)
        return Holder(**{k: v for k, v in data.items() if k in _FIELD_SET})


decode_holder = _decode  # for the admin listing (services/session/listing.py)
_FIELDS = tuple(f.name for f in fields(Holder))
_FIELD_SET = frozenset(_FIELDS)
_FIELDS_NO_WILL = tuple(f for f in _FIELDS if f not in ("will", "will_delay_s"))


def _encode(holder: Holder) -> str:
    # Not dataclasses.asdict: it deep-copies every field, 5% of a CONNECT's CPU here. An entry
    # without a will leaves its fields out (the defaults when read back).
    names = _FIELDS if holder.will else _FIELDS_NO_WILL
    return json.dumps({name: getattr(holder, name) for name in names})


class Registry:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        # Claims and releases of concurrent CONNECTs and disconnects share pipelines.
        self._claim = PipelinedScript(redis, _CLAIM)
        self._release = PipelinedScript(redis, _RELEASE)
        self._tenants = TenantIndex(redis)
        self._last_epoch = 0

    def next_epoch(self) -> int:
        """A time-ordered epoch: the clock in microseconds, above any this process gave."""
        self._last_epoch = max(time.time_ns() // 1000, self._last_epoch + 1)
        return self._last_epoch

    async def claim(
        self,
        holder: Holder,
        max_clients: int = 0,
        check_owner: bool = False,
        persistent: bool = False,
    ) -> ClaimResult:
        """Install `holder` for a CONNECT, at its epoch or just above the installed one,
        unless the client id is not connected and the tenant already has `max_clients`
        connected (0: no cap), or (`check_owner`) the installed connection belongs to an
        owner other than `holder.owner` (services/session/core.py `may_use`), or the user
        (`holder.username`) is at its `max_connections`, or (`persistent`: the CONNECT opens
        or keeps a persistent session) the client id has no persistent session counted yet
        and the tenant is at its `max_sessions`. Counted, it stays counted until
        `session_ended`."""
        generation = ""
        for _ in range(MAX_CLAIM_TRIES):
            code, prev, fresh = await self._run_claim(
                holder, max_clients, "connect", check_owner, persistent
            )
            generation = generation or fresh
            if code != 3:
                break
            # A higher epoch is installed (another session service's clock is ahead, or a
            # re-asserted connection): this CONNECT is the latest, so it goes just above.
            self._last_epoch = max(self._last_epoch, _decode(prev).epoch)
            holder = replace(holder, epoch=self.next_epoch())
        else:
            raise RuntimeError(f"claim of {holder.client_id!r} kept meeting higher epochs")
        if code == 2:
            return ClaimResult(False, None, full=True, cap=int(prev), generation=generation)
        if code == 4:
            return ClaimResult(False, _decode(prev), not_owner=True, generation=generation)
        if code in (5, 6):
            quota = "max_connections_per_user" if code == 5 else "max_sessions"
            return ClaimResult(False, None, cap=int(prev), quota=quota, generation=generation)
        return ClaimResult(
            bool(code), _decode(prev) if prev else None, epoch=holder.epoch, generation=generation
        )

    async def reclaim(self, holder: Holder) -> ClaimResult:
        """Re-assert a live connection after the registry was lost: installed unless a
        higher epoch holds the client id (then the caller kicks this one); no cap."""
        code, prev, fresh = await self._run_claim(holder, 0, "reclaim")
        return ClaimResult(
            bool(code), _decode(prev) if prev else None, epoch=holder.epoch, generation=fresh
        )

    async def _run_claim(
        self,
        holder: Holder,
        max_clients: int,
        mode: str,
        check_owner: bool = False,
        persistent: bool = False,
    ) -> tuple[int, bytes | str, str]:
        # The node's set: which clients each node holds, what to release if the node dies;
        # found through the index of tenants (a re-assertion adds its tenant in any case: the
        # index may be what was lost).
        tenant = holder.tenant
        await self._tenants.add(tenant, always=mode == "reclaim")
        code, prev, fresh = await self._claim(
            keys=claim_keys(tenant, holder.node_id, holder.username),
            args=[
                holder.client_id,
                holder.epoch,
                _encode(holder),
                max_clients,
                mode,
                uuid.uuid4().hex,
                holder.owner or "",
                "1" if check_owner else "0",
                holder.client_id,
                holder.node_id,
                holder.username,
                "1" if persistent else "0",
            ],
        )
        return int(code), prev, fresh.decode() if isinstance(fresh, bytes) else fresh

    async def check_generation(self) -> str | None:
        """Write a new generation where a sentinel is missing (Redis, or a cluster shard, lost
        its data, or was never used): the global one or a tenant's; returns it then, None
        when the registry is the one we knew."""
        return await self._tenants.check()

    async def release(self, tenant: str, client_id: str, epoch: int) -> bool:
        """Remove the client id's entry if `epoch` is the one installed."""
        return await self.end(tenant, client_id, epoch, "") == 1

    async def end(self, tenant: str, client_id: str, epoch: int, node_id: str) -> int:
        """A connection ended, in one round trip: its entry removed if `epoch` is the one
        installed (1; 0: another epoch's is; -1: no entry at all) and the client forgotten
        on `node_id` ("": no node)."""
        keys = release_keys(tenant, node_id)
        member = client_id if node_id else ""
        return int(await self._release(keys=keys, args=[client_id, epoch, member]))

    async def session_ended(self, tenant: str, client_id: str) -> None:
        """The client id's persistent session ended (discarded or expired): it no longer
        counts against the tenant's `max_sessions`."""
        await self._redis.srem(sessions_key(tenant), client_id)  # type: ignore[misc]

    async def connections_of_user(self, tenant: str, user: str) -> int:
        raw = await self._redis.hget(users_key(tenant), user)  # type: ignore[misc]
        return int(raw or 0)

    async def sessions(self, tenant: str) -> int:
        """Persistent sessions of the tenant counted against its `max_sessions`."""
        return int(await self._redis.scard(sessions_key(tenant)))  # type: ignore[misc]

    async def forget_on_node(self, node_id: str, tenant: str, client_id: str) -> None:
        await self._redis.srem(node_clients_key(tenant, node_id), client_id)  # type: ignore[misc]

    async def held_by(self, node_id: str) -> list[tuple[str, str]]:
        """(tenant, client id) of every client the node was given (may include stale ones),
        over every tenant of the index."""
        sets = await self._tenants.union(lambda t: node_clients_key(t, node_id))
        return [(tenant, client_id) for tenant, members in sets for client_id in members]

    async def known_nodes(self) -> list[str]:
        """Nodes that hold (or held) clients and were not dropped since."""
        sets = await self._tenants.union(tenant_nodes_key)
        return sorted({node for _, nodes in sets for node in nodes})

    async def drop_node(self, node_id: str) -> None:
        """Forget the node in every tenant (one pipeline; each command has one key)."""
        tenants = await self._tenants.tenants()
        if not tenants:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in tenants:
                pipe.delete(node_clients_key(tenant, node_id))
                pipe.srem(tenant_nodes_key(tenant), node_id)
            await pipe.execute()

    async def get(self, tenant: str, client_id: str) -> Holder | None:
        raw = await self._redis.hget(clients_key(tenant), client_id)  # type: ignore[misc]
        return _decode(raw) if raw else None

    async def list(self, tenant: str) -> list[Holder]:
        raw = await self._redis.hgetall(clients_key(tenant))  # type: ignore[misc]
        return sorted((_decode(v) for v in raw.values()), key=lambda h: h.client_id)
