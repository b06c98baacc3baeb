"""Flapping detection: a client that connects too often in a window is banned for a while.

Keyed on the client id AND the address together: each CONNECT counts against its
(tenant, client id, address) and, when `max_per_address` is set, against its address alone,
so a client that changes its client id on every reconnect is caught by the second count.
The first count bans the client id (for its tenant); the second bans the address.

The counts are in Redis, shared by every session service instance (a node's CONNECTs go to
whichever instance the queue group picks, so per-instance counts would let a client connect
as many times more as there are instances). A Lua script keeps each key's sliding window
as a sorted set of connect times: at most `max + 1` members, expiring a window after the
last CONNECT, so a flood of new ids holds at most one small key per CONNECT of the last
window. The CONNECTs of one event-loop turn are counted by one call of the script
(services/session/pipelined.py BatchedScript); one EVAL each, with the script's text, took
a quarter of the session service's CPU per CONNECT (bench/connects.py, py-spy). Redis
unreachable: the CONNECT goes on uncounted (flapping protects the service; it must not
take it down with Redis).

Redis Cluster: both keys of a CONNECT carry its address as their hash tag (a digest of it),
so each CONNECT's two counts are on one slot; the batch of a loop turn is split by slot
(BatchedScript), one call per slot.
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from services.common.bans import peer_ip
from services.session.pipelined import BatchedScript

log = logging.getLogger("starling.session.flapping")
PREFIX = "starling:flap:"

# One call for every CONNECT of an event-loop turn (BatchedScript). KEYS, per CONNECT: its
# (tenant, client id, address) key and its address key. ARGV: window ms, max, max per
# address (0: none), then per CONNECT: now ms and a member unique to it.
# Per CONNECT two replies: 0, 0: fine; 1, n: the client id flaps; 2, n: the address does.
_COUNT = """
local window, max, max_address = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function count(key, limit, now, member)
  redis.call('ZADD', key, now, member)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. (now - window))
  redis.call('ZREMRANGEBYRANK', key, 0, -(limit + 2))
  redis.call('PEXPIRE', key, window)
  local n = redis.call('ZCARD', key)
  if n > limit then redis.call('DEL', key) end
  return n
end
local out = {}
for i = 1, #KEYS / 2 do
  local now, member = tonumber(ARGV[2 + 2 * i]), ARGV[3 + 2 * i]
  local which, n = 0, 0
  local c = count(KEYS[2 * i - 1], max, now, member)
  if c > max then
    which, n = 1, c
  elseif max_address > 0 then
    c = count(KEYS[2 * i], max_address, now, member)
    if c > max_address then which, n = 2, c end
  end
  out[#out + 1] = which
  out[#out + 1] = n
end
return out
"""


@dataclass(frozen=True, slots=True)
class Flap:
    """A client found flapping: ban `client_id` in `tenant`, or (`client_id` empty) the
    address."""

    tenant: str
    client_id: str
    address: str
    connects: int


def count_key(*parts: str) -> str:
    """The count of `parts`, the address last: tagged with the address (one slot for the two
    counts of a CONNECT). Hashed: client ids may be long, and a key's size should not depend
    on them."""
    address = hashlib.blake2b(parts[-1].encode(), digest_size=8).hexdigest()
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=16).hexdigest()
    return f"{PREFIX}{{{address}}}:{digest}"


@lru_cache(maxsize=4096)
def _ip_text(host: str) -> str | None:
    """`host` as a normalized IP (as `peer_ip` gives it), None when it is not one."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def address_of(peer: str) -> str:
    """The IP a count is kept for: the peer's, normalized (an IPv4-mapped IPv6 address as
    IPv4), or the peer as it is when it names no IP. Every CONNECT asks: the parse of an
    "ip:port" peer is cached by its IP text (ports differ, addresses repeat)."""
    host, sep, port = peer.rpartition(":")
    if sep and port.isdigit() and not peer.startswith(("ws:", "[")):
        text = _ip_text(host)
        if text is not None:
            return text
    ip = peer_ip(peer)
    return str(ip) if ip is not None else peer


class FlapDetector:
    def __init__(
        self,
        redis: Any,
        max_connects: int,
        window_s: float,
        max_per_address: int = 0,
        instance: str = "",
    ) -> None:
        self._max = max_connects
        self._max_address = max_per_address
        self._window_ms = max(1, int(window_s * 1000))
        self._count = BatchedScript(
            redis, _COUNT, [self._window_ms, self._max, self._max_address], reply_len=2
        )
        self._instance = instance
        self._seq = itertools.count()

    def limit_text(self, flap: Flap) -> str:
        """The settings a refusal names, with their values: which count was over and the
        window (`flapping_enabled=false` turns detection off; docs/configuration.md)."""
        window = f"flapping_window_s {self._window_ms / 1000:g}"
        if flap.client_id:
            return f"flapping_max_connects {self._max}, {window}"
        return f"flapping_max_connects_per_address {self._max_address}, {window}"

    async def connected(self, tenant: str, client_id: str, peer: str, now_ms: int) -> Flap | None:
        """Count one CONNECT (at wall-clock `now_ms`); a `Flap` when it is one too many
        within the window (the count starts over, so the next ban comes only after as many
        again)."""
        address = address_of(peer)
        member = f"{now_ms}:{self._instance}:{next(self._seq)}"
        try:
            which, n = await self._count(
                [count_key(tenant, client_id, address), count_key("", "", address)],
                [now_ms, member],
            )
        except Exception as exc:
            log.warning("flapping_count_failed", extra={"error": type(exc).__name__})
            return None
        if int(which) == 1:
            return Flap(tenant, client_id, address, int(n))
        if int(which) == 2:
            return Flap(tenant, "", address, int(n))
        return None
