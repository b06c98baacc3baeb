"""The node's clock: keep-alive and CONNECT timeouts, heartbeats, safety-net polls.

Every half second each channel gets a tick (keep-alive at 1.5 times the interval
[MQTT-3.1.2-24], CONNECT timeout); every second the node publishes its heartbeat (the session
service parks a silent node's sessions), every persistent delivery whose safety-net poll is
due reads its queue (for notices lost on the way; persistence.py `poll_if_due` says when),
and old kick tombstones are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client

from services.common.bus import subjects
from services.connection.channel import Action
from services.connection.conn import Conn
from services.connection.registry import Registry

log = logging.getLogger("starling.connection.sweeper")

TICK_S = 0.5


class Sweeper:
    def __init__(
        self,
        node_id: str,
        registry: Registry,
        nc: Client,
        carry_out: Callable[[Conn, list[Action]], None],
        mark_dirty: Callable[[Conn], None],
    ) -> None:
        self._node_id = node_id
        self._registry = registry
        self._nc = nc
        self._carry_out = carry_out
        self._mark_dirty = mark_dirty

    async def run(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(TICK_S)
            rounds += 1
            self.tick(time.time(), poll=rounds % 2 == 0)
            if rounds % 2 == 0:
                await self._heartbeat()
                self._registry.expire_tombstones(time.monotonic())

    def tick(self, now: float, poll: bool) -> None:
        for conn in list(self._registry.conns):
            try:
                self._tick_one(conn, now, poll)
            except Exception:
                # One connection's failure must not stop keep-alive checks and heartbeats
                # for every other (a silent node is declared dead by the session service).
                log.exception("sweep_failed", extra={"client_id": conn.channel.client_id})

    def _tick_one(self, conn: Conn, now: float, poll: bool) -> None:
        ch = conn.channel
        actions = ch.tick(now)
        if actions:
            self._carry_out(conn, actions)
        elif ch.out:
            self._mark_dirty(conn)
        if poll and conn.persistent is not None:
            conn.persistent.poll_if_due(now)

    async def _heartbeat(self) -> None:
        try:
            await self._nc.publish(subjects.node_heartbeat(self._node_id), self._node_id.encode())
        except Exception:  # NATS away: the session service will notice
            log.warning("heartbeat_failed")
