"""Node drain: taking one connection node out of service without dropping its clients' state
(rolling upgrades, docs/operations.md).

Owns the drain's state and its pacing. A drain, once begun, runs to its end inside the node
process, whoever asked for it: the CLI (or a preStop hook) only asks, asking again starts
nothing new and reports progress, and the state is in memory only, so a node started again
after a crash serves as usual. Steps:

1. stop accepting (`stop_accepting`: listeners closed, gRPC health NOT_SERVING so load
   balancers move away); a CONNECT that was already on its way is refused with CONNACK 0x9C
   and the Server Reference (MQTT 3: return code 3);
2. close the open connections at `rate_per_s`, MQTT 5 clients first: they get DISCONNECT
   0x9C (Use another server) with the Server Reference; MQTT 3 clients are closed. Pacing
   keeps the reconnect wave (and the session service's CONNECT work on the other nodes)
   bounded. A connection stops being read when its turn comes, and its DISCONNECT waits
   (at most the node's `ack_wait_s`) for the acks it is owed: PUBACK/PUBREC of publishes
   being stored, PUBCOMP of releases being written. The socket then closes lingering
   (linger.py), so a client busy writing still reads its DISCONNECT;
3. once no connection is left, or at `timeout_s` (whatever remains is closed at once), wait
   for the session releases, wills and mesh publishes under way, then resolve `finished`:
   the process exits as on SIGTERM.

Persistent sessions are released as on any disconnect: their queues keep every message and
the next CONNECT on another node resumes them. A drain is a server-side close without a
DISCONNECT 0x00 from the client, so wills are published [MQTT-3.1.2-8], after their Will
Delay Interval: a client that reconnects elsewhere within it cancels its will.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.mqtt.reason import ReasonCode as RC

if TYPE_CHECKING:
    from services.connection.conn import Conn
    from services.connection.node import Node

log = logging.getLogger("starling.connection.drain")

# How often the pacer wakes up: at 500/s that is 5 closes a turn, small enough not to stall
# the event loop, coarse enough not to spin.
TICK_S = 0.01
# After the last close: how long the session releases, wills and mesh publishes may take.
SETTLE_S = 5.0
REASON = "node draining"


@dataclass(frozen=True, slots=True)
class DrainStatus:
    started: bool  # this request began the drain
    connections: int  # still open
    server_reference: str
    remaining_s: float  # before what remains is closed at once


class Drain:
    def __init__(
        self,
        *,
        node: Node,
        rate_per_s: int,
        timeout_s: float,
        default_reference: str,
        stop_accepting: Callable[[], Awaitable[None]],
        finished: asyncio.Future[None],
    ) -> None:
        self._node = node
        self._rate = rate_per_s
        self._timeout_s = timeout_s
        self._default_reference = default_reference
        self._stop_accepting = stop_accepting
        self._finished = finished
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self.reference = ""
        # Connections no longer read, waiting for their acks before their DISCONNECT.
        self._owed: dict[Conn, float] = {}

    @property
    def active(self) -> bool:
        return self._task is not None

    def begin(self, server_reference: str = "") -> DrainStatus:
        """Start draining (a node already draining keeps its reference and deadline)."""
        started = self._task is None
        if started:
            self.reference = server_reference or self._default_reference
            self._deadline = time.monotonic() + self._timeout_s
            # From now on a CONNECT that reaches the node is sent elsewhere (admission.py).
            self._node.admission.drain(self.reference)
            self._task = asyncio.create_task(self._run(), name="node-drain")
            log.warning(
                "node_draining",
                extra={"node": self._node.node_id, "server_reference": self.reference},
            )
        return DrainStatus(
            started,
            len(self._node.registry),
            self.reference,
            max(0.0, self._deadline - time.monotonic()),
        )

    async def _run(self) -> None:
        node = self._node
        try:
            await self._stop_accepting()
            closed = await self._close_paced()
            log.warning("node_drained", extra={"node": node.node_id, "closed": closed})
            await node.settle(SETTLE_S)
        except Exception:
            log.exception("node_drain_failed")  # exits all the same: it was asked to go
        if not self._finished.done():
            self._finished.set_result(None)

    async def _close_paced(self) -> int:
        """Close every connection, at most `rate` a second (the first at once); past the
        deadline, the rest at once. Returns how many were closed."""
        start = time.monotonic()
        closed = 0
        while True:
            # Once per pass, not per tick: a pass over 100k connections is not free. A pass
            # after the last one catches connections that opened while the listeners closed.
            pending = sorted(
                (c for c in self._node.registry.conns if not c.closed and c not in self._owed),
                key=lambda c: c.channel.level != 5,
            )
            if time.monotonic() > self._deadline + SETTLE_S:
                self._disconnect_owed(force=True)
                return closed
            if not pending and not self._owed:
                return closed
            i = 0
            while i < len(pending):
                now = time.monotonic()
                if now >= self._deadline:
                    allowed = len(pending) - i
                else:
                    allowed = int((now - start) * self._rate) + 1 - closed
                for conn in pending[i : i + max(0, allowed)]:
                    self._close(conn, now)
                    closed += 1
                i += max(0, allowed)
                self._disconnect_owed()
                if i < len(pending):
                    await asyncio.sleep(TICK_S)
            await asyncio.sleep(TICK_S)  # let the closes run before looking again
            self._disconnect_owed()

    def _close(self, conn: Conn, now: float) -> None:
        """Its DISCONNECT now, or once the acks it is owed are written (at most
        `ack_wait_s`): it stops being read first, so no exchange begins meanwhile. Without
        the wait a PUBREL whose release the node wrote gets no PUBCOMP here, and 0x92
        (Packet Identifier not found) when the client sends it again on the next node."""
        if conn.closed:
            return
        ch = conn.channel
        ch.stop_reading()
        if ch.owes_acks:
            self._owed[conn] = now + self._node.ack_wait_s
        else:
            self._disconnect(conn)

    def _disconnect_owed(self, force: bool = False) -> None:
        """DISCONNECT the connections waiting for their acks that have them, or waited long
        enough."""
        if not self._owed:
            return
        now = time.monotonic()
        for conn, until in list(self._owed.items()):
            if force or now >= until or conn.closed or not conn.channel.owes_acks:
                del self._owed[conn]
                self._disconnect(conn)

    def _disconnect(self, conn: Conn) -> None:
        if conn.closed:
            return
        actions = conn.channel.disconnect(RC.USE_ANOTHER_SERVER, REASON, self.reference)
        if actions:
            self._node.carry_out(conn, actions)
        else:  # its channel had closed already but the transport had not said so yet
            conn.sink.close()
            self._node.cleanup(conn)
