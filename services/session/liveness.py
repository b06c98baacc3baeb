"""Connection-node liveness: what to do with the clients of a node that died.

Nodes publish a heartbeat on `hb.node.<node_id>` every second. A node silent for
`node_timeout_s` is declared dead: every client the registry says it held is released, and
its persistent session is parked as disconnected at the node's last heartbeat, so session
expiry runs even when a SIGKILLed node's clients never come back, and its figures in the
tenants' subscription counts are removed (services/quota/subscriptions.py). Nodes named in the
registry's set of nodes holding clients count as seen from the moment this service learns
of them (at start, and on every check), so a node that died while the session service was
down, or before its first heartbeat or hello reached this service, is found too. The wills
its entries kept are published (services/session/wills.py), each by the one instance whose
release of the entry succeeded, a chunk at a time as the entries are released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from services.common.bus import subjects
from services.session.registry import Holder, Registry
from services.session.sessions import Sessions
from services.session.wills import StoredWills

log = logging.getLogger("starling.session.liveness")

# Wills of a dead node go out this many at a time as its entries are released (not after
# all of them): a client that comes back meanwhile finds its delayed will at the router.
WILL_CHUNK = 64


class NodeLiveness:
    def __init__(
        self,
        registry: Registry,
        sessions: Sessions,
        timeout_s: float,
        drop_subscriptions: Callable[[str], Awaitable[None]] | None = None,
        wills: StoredWills | None = None,
    ) -> None:
        self._registry = registry
        self._wills = wills
        self._drop_subscriptions = drop_subscriptions
        self._sessions = sessions
        self._timeout = timeout_s
        self.last_seen: dict[str, float] = {}  # node id -> time.monotonic()

    async def start(self, nc: Any) -> None:
        now = time.monotonic()
        for node in await self._registry.known_nodes():
            self.last_seen.setdefault(node, now)
        await nc.subscribe(subjects.NODE_HEARTBEATS, cb=self._on_heartbeat)
        await nc.subscribe(subjects.NODE_HELLOS, cb=self._on_hello)

    async def _on_heartbeat(self, msg: Any) -> None:
        self.last_seen[msg.data.decode()] = time.monotonic()

    async def _on_hello(self, msg: Any) -> None:
        """A node (re)started: whatever its previous life held is gone (since its last
        heartbeat, as far as this instance knows)."""
        node = msg.data.decode()
        died_at_ms = int((time.time() - self.silent_for(node)) * 1000)
        self.last_seen[node] = time.monotonic()
        await self.release_node(node, died_at_ms)

    def silent_for(self, node: str) -> float:
        """Seconds since the node's last heartbeat (0: never heard of)."""
        seen = self.last_seen.get(node)
        return time.monotonic() - seen if seen is not None else 0.0

    async def check(self) -> list[str]:
        """Declare silent nodes dead and release their clients; returns the dead nodes."""
        now = time.monotonic()
        for node in await self._registry.known_nodes():
            self.last_seen.setdefault(node, now)
        dead = [n for n, seen in self.last_seen.items() if now - seen > self._timeout]
        for node in dead:
            died_at_ms = int((time.time() - (now - self.last_seen[node])) * 1000)
            del self.last_seen[node]
            await self.release_node(node, died_at_ms)
        return dead

    async def release_node(self, node: str, died_at_ms: int) -> int:
        released = 0
        with_wills: list[Holder] = []
        for tenant, client_id in await self._registry.held_by(node):
            holder = await self._registry.get(tenant, client_id)
            if holder is None or holder.node_id != node:
                continue  # reconnected elsewhere meanwhile
            if await self._registry.release(tenant, client_id, holder.epoch):
                await self._sessions.park(tenant, client_id, died_at_ms, holder.epoch)
                released += 1
                if holder.will and self._wills is not None:
                    with_wills.append(holder)
                    if len(with_wills) >= WILL_CHUNK:
                        await self._wills.publish(with_wills, died_at_ms)
                        with_wills = []
        if with_wills and self._wills is not None:
            await self._wills.publish(with_wills, died_at_ms)
        await self._registry.drop_node(node)
        if self._drop_subscriptions is not None:
            await self._drop_subscriptions(node)
        if released:
            log.warning("node_down", extra={"node": node, "released_clients": released})
        return released

    async def run(self, period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.check()
            except Exception:  # keep watching; one failed pass must not stop it
                log.exception("liveness_check_failed")
