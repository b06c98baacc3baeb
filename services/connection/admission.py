"""Connections per peer address on this node: counted from accept to close, and checked when
the client's CONNECT is about to be authenticated (over the cap: CONNACK 0x97, 3.1.1 code 3).

Counting starts at accept so that sockets still in their pre-CONNECT phase count too: an
address cannot get past the cap by opening sockets faster than they authenticate. The cap is
per node (each node knows only its own sockets); behind a load balancer or NAT many clients
share one address, so raise it or set 0 (no cap) there.
"""

from __future__ import annotations


def peer_address(peer: str) -> str:
    """The address part of a channel's peer: "ip:port" (TCP, TLS; IPv6 "::1:5000") or
    "ws:ip" (WebSocket)."""
    if peer.startswith("ws:"):
        return peer[3:]
    host, sep, _port = peer.rpartition(":")
    return host if sep else peer


class PerAddress:
    def __init__(self, max_per_address: int) -> None:
        self._max = max_per_address
        self._open: dict[str, int] = {}

    def opened(self, peer: str) -> None:
        addr = peer_address(peer)
        self._open[addr] = self._open.get(addr, 0) + 1

    def closed(self, peer: str) -> None:
        addr = peer_address(peer)
        left = self._open.get(addr, 0) - 1
        if left > 0:
            self._open[addr] = left
        else:
            self._open.pop(addr, None)

    def over(self, peer: str) -> bool:
        """More connections are open from this peer's address than the cap allows (it
        counts the asking connection itself)."""
        return bool(self._max) and self._open.get(peer_address(peer), 0) > self._max

    def count(self, peer: str) -> int:
        return self._open.get(peer_address(peer), 0)
