"""Session registry in Redis: which node holds which client, with a registry epoch.

Theory of operation: every CONNECT takes a fresh epoch from one counter per client
(`INCR`); `claim` then installs (node, epoch) only if no higher epoch is installed, atomically
(Lua). So of two racing CONNECTs the later epoch always ends installed, the earlier one learns
it lost (its own claim is refused, or its node receives a kick for its epoch), and exactly one
connection survives. `release` removes the entry only for the epoch that owns it.
The tenant's hash has one entry per connected client id, so its length is the tenant's
connection count mesh-wide: `claim` refuses a new client id, in the same atomic step, when the
tenant is at its cap (taking over a client id already connected never adds one).
Redis holds only what may be lost: losing it drops the registry, never a message.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from redis.asyncio import Redis

_CLAIM = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local old = cjson.decode(cur)
  if tonumber(old['epoch']) > tonumber(ARGV[2]) then return {0, cur} end
elseif tonumber(ARGV[4]) > 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return {2, ''}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return {1, cur or ''}
"""

_RELEASE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
if tonumber(cjson.decode(cur)['epoch']) == tonumber(ARGV[2]) then
  redis.call('HDEL', KEYS[1], ARGV[1]); return 1
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


@dataclass(frozen=True, slots=True)
class ClaimResult:
    won: bool
    previous: Holder | None
    full: bool = False  # refused: a new client id and the tenant at its connection cap


def _key(tenant: str) -> str:
    return f"st:clients:{tenant}"


def _node_key(node_id: str) -> str:
    return f"st:node:{node_id}:clients"


_NODES = "st:nodes"  # ids of the nodes that hold clients (each has a _node_key set)


def _member(tenant: str, client_id: str) -> str:
    return f"{tenant}\0{client_id}"


def _decode(raw: bytes | str) -> Holder:
    return Holder(**json.loads(raw))


class Registry:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)

    async def next_epoch(self, tenant: str, client_id: str) -> int:
        return int(await self._redis.incr(f"st:epoch:{tenant}:{client_id}"))

    async def claim(self, holder: Holder, max_clients: int = 0) -> ClaimResult:
        """Install `holder` unless a later epoch holds its client id, or the client id is not
        connected and the tenant already has `max_clients` connected (0: no cap)."""
        won, prev = await self._claim(
            keys=[_key(holder.tenant)],
            args=[holder.client_id, holder.epoch, json.dumps(asdict(holder)), max_clients],
        )
        if won == 2:
            return ClaimResult(False, None, full=True)
        if won:
            # Which clients each node holds: what to release if the node dies.
            await self._redis.sadd(
                _node_key(holder.node_id),  # type: ignore[misc]
                _member(holder.tenant, holder.client_id),
            )
            await self._redis.sadd(_NODES, holder.node_id)  # type: ignore[misc]
        return ClaimResult(bool(won), _decode(prev) if prev else None)

    async def release(self, tenant: str, client_id: str, epoch: int) -> bool:
        return bool(await self._release(keys=[_key(tenant)], args=[client_id, epoch]))

    async def forget_on_node(self, node_id: str, tenant: str, client_id: str) -> None:
        await self._redis.srem(_node_key(node_id), _member(tenant, client_id))  # type: ignore[misc]

    async def held_by(self, node_id: str) -> list[tuple[str, str]]:
        """(tenant, client id) of every client the node was given (may include stale ones)."""
        raw = await self._redis.smembers(_node_key(node_id))  # type: ignore[misc]
        out = []
        for m in raw:
            tenant, _, client_id = (m.decode() if isinstance(m, bytes) else m).partition("\0")
            out.append((tenant, client_id))
        return out

    async def known_nodes(self) -> list[str]:
        """Nodes that hold (or held) clients and were not dropped since."""
        raw = await self._redis.smembers(_NODES)  # type: ignore[misc]
        return sorted(m.decode() if isinstance(m, bytes) else m for m in raw)

    async def drop_node(self, node_id: str) -> None:
        await self._redis.delete(_node_key(node_id))
        await self._redis.srem(_NODES, node_id)  # type: ignore[misc]

    async def get(self, tenant: str, client_id: str) -> Holder | None:
        raw = await self._redis.hget(_key(tenant), client_id)  # type: ignore[misc]
        return _decode(raw) if raw else None

    async def list(self, tenant: str) -> list[Holder]:
        raw = await self._redis.hgetall(_key(tenant))  # type: ignore[misc]
        return sorted((_decode(v) for v in raw.values()), key=lambda h: h.client_id)
