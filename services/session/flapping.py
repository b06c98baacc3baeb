"""Flapping detection: a client that connects too often in a window is banned for a while.

Keyed on the client id AND the address together: each CONNECT counts against its
(tenant, client id, address) and, when `max_per_address` is set, against its address alone,
so a client that changes its client id on every reconnect is caught by the second count.
The first count bans the client id (for its tenant); the second bans the address. Counts are
this session service instance's (each instance sees the CONNECTs the nodes send it); the ban
is cluster-wide (the quota service's list).

Sliding windows kept as the times of the last connects, at most `max + 1` per key; at most
`max_tracked` keys (the oldest dropped), so a flood of new ids cannot grow it without bound.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from dataclasses import dataclass
from functools import lru_cache

from services.common.bans import peer_ip


@dataclass(frozen=True, slots=True)
class Flap:
    """A client found flapping: ban `client_id` in `tenant`, or (`client_id` empty) the
    address."""

    tenant: str
    client_id: str
    address: str
    connects: int


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
        max_connects: int,
        window_s: float,
        max_per_address: int = 0,
        max_tracked: int = 100_000,
    ) -> None:
        self._max = max_connects
        self._max_address = max_per_address
        self._window = window_s
        self._max_tracked = max_tracked
        self._seen: OrderedDict[tuple[str, str, str], deque[float]] = OrderedDict()

    def _count(self, key: tuple[str, str, str], limit: int, now: float) -> int:
        times = self._seen.get(key)
        if times is None:
            times = self._seen[key] = deque(maxlen=limit + 1)
            if len(self._seen) > self._max_tracked:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(key)
        times.append(now)
        while times and now - times[0] > self._window:
            times.popleft()
        return len(times)

    def connected(self, tenant: str, client_id: str, peer: str, now: float) -> Flap | None:
        """Count one CONNECT; a `Flap` when it is one too many within the window (the count
        starts over, so the next ban comes only after as many again)."""
        address = address_of(peer)
        n = self._count((tenant, client_id, address), self._max, now)
        if n > self._max:
            self._seen.pop((tenant, client_id, address), None)
            return Flap(tenant, client_id, address, n)
        if self._max_address:
            n = self._count(("", "", address), self._max_address, now)
            if n > self._max_address:
                self._seen.pop(("", "", address), None)
                return Flap(tenant, "", address, n)
        return None
