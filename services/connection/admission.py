"""Connections per peer address on this node: counted from accept to close, and checked when
the client's CONNECT is about to be authenticated (over the cap: CONNACK 0x97, 3.1.1 code 3).

Counting starts at accept so that sockets still in their pre-CONNECT phase count too: an
address cannot get past the cap by opening sockets faster than they authenticate. The cap is
per node (each node knows only its own sockets). The address is the client's real one once
the listener knows it (a PROXY protocol header, a trusted proxy's X-Forwarded-For: the
listener opens the connection with it); behind a load balancer that sends neither, every
client shares the balancer's address, so raise the cap or set 0 (no cap) there.
"""

from __future__ import annotations

import logging

from services.common.connect import ConnectOutcome
from services.common.mqtt.reason import ReasonCode as RC

log = logging.getLogger("starling.connection.admission")
SETTING = "max_connections_per_ip"
LOG_EVERY_S = 10.0  # a flood from one address logs a line per interval, not per refusal


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
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0  # refusals since the last log line

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

    def why(self) -> str:
        """The Reason String of a refusal: which setting refused, and what to do."""
        return (
            f"too many connections from this address ({SETTING}={self._max}; "
            "raise it or set 0 behind a load balancer)"
        )

    def refusal(self, peer: str, now: float) -> ConnectOutcome | None:
        """The CONNACK refusal of a CONNECT from `peer` over the cap (logged, at most once
        per LOG_EVERY_S with the count since), or None: admitted. `now`: monotonic s."""
        if not self.over(peer):
            return None
        self._unlogged += 1
        if now - self._logged_at >= LOG_EVERY_S:
            log.warning(
                "connections_per_ip_refused",
                extra={
                    "address": peer_address(peer),
                    "open": self.count(peer),
                    "refused": self._unlogged,
                    SETTING: self._max,
                    "why": self.why(),
                },
            )
            self._logged_at, self._unlogged = now, 0
        return ConnectOutcome(reason_code=RC.QUOTA_EXCEEDED, reason_string=self.why())
