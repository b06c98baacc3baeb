"""Whether a CONNECT is authenticated on this node (`Admission`): not while the node drains,
nor while it is fenced, nor past its address's cap of connections (`PerAddress`); and the
connected clients a new ban names are disconnected (`Admission.kick_banned`).

Connections per peer address on this node are counted from accept to close, and checked when
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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.common import clock
from services.common.bans import BanList
from services.common.connect import ConnectOutcome
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals
from services.connection.channel import Action, Authenticate
from services.connection.conn import Conn

if TYPE_CHECKING:  # lease.py imports the node, which imports this module
    from services.connection.lease import NodeLease

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


class Admission:
    def __init__(
        self,
        *,
        conns: set[Conn],
        per_address: PerAddress,
        lease: NodeLease,
        refusals: Refusals,
        carry_out: Callable[[Conn, list[Action]], None],
        authenticate: Callable[[Conn, Authenticate], None],
    ) -> None:
        self._conns = conns  # the registry's open connections
        self._per_address = per_address
        self._lease = lease
        self._refusals = refusals
        self._carry_out = carry_out
        self._authenticate = authenticate
        # Set while the node drains (drain.py): the Server Reference a CONNECT that still
        # reaches it is refused with.
        self.drain_reference: str | None = None

    def drain(self, server_reference: str) -> None:
        """From now on a CONNECT that reaches the node is sent to `server_reference`."""
        self.drain_reference = server_reference

    def admit(self, conn: Conn, action: Authenticate) -> None:
        """Authenticate the CONNECT unless its address holds too many connections here or
        the node drains (then: elsewhere, CONNACK 0x9C with the Server Reference)."""
        ch = conn.channel
        if self.drain_reference is not None:
            self._refusals.count("draining")
            ref = self.drain_reference
            self._carry_out(conn, ch.disconnect(RC.USE_ANOTHER_SERVER, "draining", ref))
            return
        if self._lease.fenced:  # its right to hold clients lapsed (lease.py): at once, 0x88
            self._refusals.count("node_fenced")
            self._carry_out(conn, ch.authenticated(self._lease.refusal(), time.time()))
            return
        refused = self._per_address.refusal(ch.peer, time.monotonic())
        if refused is not None:
            self._refusals.count("connections_per_ip")
            self._carry_out(conn, ch.authenticated(refused, time.time()))
            return
        self._authenticate(conn, action)

    def kick_banned(self, bans: BanList) -> None:
        """The ban list changed: disconnect every client it names now. DISCONNECT 0x98
        (Administrative action) with the ban's reason as Reason String: 0x8A (Banned) is a
        CONNACK code only, not allowed in DISCONNECT [MQTT-3.14.2.1] (paho calls it a
        protocol error); the client's next CONNECT gets CONNACK 0x8A."""
        if not len(bans):
            return
        now_ms = clock.now_ms()
        for conn in list(self._conns):
            ch = conn.channel
            if not conn.registered or conn.closed:
                continue
            name = ch.identity.partition("/")[2]
            ban = bans.match(ch.tenant, ch.client_id, name, ch.peer, now_ms)
            if ban is not None:
                self._refusals.count("banned", ch.tenant)
                why = f"banned: {ban.reason}" if ban.reason else "banned"
                self._carry_out(conn, ch.disconnect(RC.ADMINISTRATIVE_ACTION, why))
