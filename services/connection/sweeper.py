"""The node's clock: keep-alive and CONNECT timeouts, heartbeats, safety-net polls.

Every half second the channels that are due get a tick (keep-alive at 1.5 times the
interval [MQTT-3.1.2-24], CONNECT timeout, slow consumers): each channel says when it may
next have something to do (`Channel.next_check`), and a congestion that starts says so
(`Node.sweep_at`), so an idle connection is looked at about once a keep-alive period, not
twice a second. A persistent session's connection is also looked at when its safety-net
poll of the queue is due (for notices lost on the way: persistence.py `next_poll`, and its
`wake` when that comes sooner), and all of them at once when the queue client's generation
moves. Every second the node sends its heartbeat (the session service parks a silent
node's sessions; with a lease, lease.py, the heartbeat is a request whose answer renews the
node's right to hold its clients) and old kick tombstones are dropped. Every tick checks
the lease first, from the last confirmed send time, so a node that resumes from a long
pause fences before it looks at any connection.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Callable

from nats.aio.client import Client

from services.common.bus import subjects
from services.connection.channel import Action
from services.connection.conn import Conn
from services.connection.lease import NodeLease
from services.connection.registry import Registry
from services.queue.client import QueueClient

log = logging.getLogger("starling.connection.sweeper")

TICK_S = 0.5


class Sweeper:
    def __init__(
        self,
        *,
        node_id: str,
        registry: Registry,
        nc: Client,
        carry_out: Callable[[Conn, list[Action]], None],
        mark_dirty: Callable[[Conn], None],
        queue: QueueClient | None = None,
        lease: NodeLease | None = None,
    ) -> None:
        self._node_id = node_id
        self._lease = lease
        self._beats: set[asyncio.Task[None]] = set()
        self._registry = registry
        self._nc = nc
        self._carry_out = carry_out
        self._mark_dirty = mark_dirty
        # A timing wheel of TICK_S slots: slot -> the connections to look at in it (each in
        # one slot at most, `Conn.sweep_slot`; a closed one leaves at once, `forget`, so a
        # long keep-alive does not keep a closed connection's memory).
        self._wheel: dict[int, set[Conn]] = {}
        self._slots: list[int] = []  # the wheel's slots, a heap
        self._queue = queue
        self._generation = queue.generation if queue is not None else 0

    async def run(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(TICK_S)
            rounds += 1
            if self._lease is not None:
                self._lease.check(time.monotonic())
            self.tick(time.time())
            if rounds % 2 == 0:
                await self._heartbeat()
                self._registry.expire_tombstones(time.monotonic())

    def schedule(self, conn: Conn, at: float) -> None:
        """Look at `conn` in the first tick after `at` (unless it is looked at sooner)."""
        slot = int(at / TICK_S) + 1
        if conn.sweep_slot:
            if conn.sweep_slot <= slot:
                return
            self.forget(conn)
        conn.sweep_slot = slot
        bucket = self._wheel.get(slot)
        if bucket is None:
            self._wheel[slot] = bucket = set()
            heapq.heappush(self._slots, slot)
        bucket.add(conn)

    def forget(self, conn: Conn) -> None:
        """`conn` needs no more looks (it closed, or moves to another slot)."""
        bucket = self._wheel.get(conn.sweep_slot)
        if bucket is not None:
            bucket.discard(conn)
            if not bucket:
                del self._wheel[conn.sweep_slot]  # its slot stays in the heap, popped in time
        conn.sweep_slot = 0

    @property
    def watched(self) -> int:
        """Connections waiting for a look."""
        return sum(map(len, self._wheel.values()))

    def tick(self, now: float) -> None:
        """Look at the connections that are due: those in a handshake (every tick, from the
        first after `Node.open`), and the others when their keep-alive may have run out,
        when their congestion may have lasted too long, and (persistent sessions) when
        their safety-net poll may be due. A connection is not looked at in between: 15,000
        idle ones cost 5.5% of a core when each was looked at every tick."""
        self._on_generation(now)
        due: list[Conn] = []
        current = int(now / TICK_S)
        while self._slots and self._slots[0] <= current:
            for conn in self._wheel.pop(heapq.heappop(self._slots), ()):
                conn.sweep_slot = 0
                due.append(conn)
        for conn in due:
            if conn.closed:
                continue
            try:
                self._tick_one(conn, now)
            except Exception:
                # One connection's failure must not stop keep-alive checks and heartbeats
                # for every other (a silent node is declared dead by the session service).
                log.exception("sweep_failed", extra={"client_id": conn.channel.client_id})
            if not conn.closed:
                at = conn.channel.next_check(now)
                if conn.persistent is not None:
                    at = min(at, conn.persistent.next_poll)
                if at < math.inf:
                    self.schedule(conn, at)

    def _on_generation(self, now: float) -> None:
        """The queue client's generation moved (notices may have been lost): every persistent
        session gets its look, and so its safety-net poll, in this tick."""
        if self._queue is None or self._queue.generation == self._generation:
            return
        self._generation = self._queue.generation
        for conn in self._registry.conns:
            if conn.persistent is not None:
                self.schedule(conn, now - TICK_S)

    def _tick_one(self, conn: Conn, now: float) -> None:
        ch = conn.channel
        actions = ch.tick(now)
        if actions:
            self._carry_out(conn, actions)
        elif ch.out:
            self._mark_dirty(conn)
        if conn.persistent is not None:
            conn.persistent.poll_if_due(now)

    async def _heartbeat(self) -> None:
        if self._lease is not None:
            # In the background: the answer may take up to the fence time; ticks go on.
            beat = asyncio.get_running_loop().create_task(self._lease.beat(), name="heartbeat")
            self._beats.add(beat)
            beat.add_done_callback(self._beats.discard)
            return
        try:
            await self._nc.publish(subjects.node_heartbeat(self._node_id), self._node_id.encode())
        except Exception:  # NATS away: the session service will notice
            log.warning("heartbeat_failed")
