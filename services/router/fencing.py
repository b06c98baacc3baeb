"""Versions of every tenant's persistent route table, and the fence that lets connection
nodes route from their own copies safely.

A node that holds a copy of a tenant's table (services/connection/replica.py) appends a
publish straight to the queues its copy chooses, with the copy's version; a queue instance
writes only if that version is the one it last learned (services/queue/core.py). Before the
router changes a table, it makes every queue instance learn a new, higher version; only then
does it change the table, answer (so the node sends the SUBACK) and publish the change on
rt.routes.<tenant> for the copies. So a publish that arrives anywhere after the SUBACK is
either chosen from a copy that has the subscription or refused and sent through the router.

A version stands for one content of the table within one router process; a new process
starts every tenant at the current time in microseconds, above what its predecessor used
unless the clock went back, and a fence that finds a queue holding a higher version goes
above it.

Several router instances (`replay` given, services/router/cluster.py): a version stands for
"every change fenced at or below it", whoever made it. A change is written to the store
first, fenced next, and the instance then replays the tenant's route events from the store
before it takes the new version; an instance whose version the queues refuse (another one
changed the table) reads the version the queues hold, replays, and fences that version
again (`catch_up`). Its RouteChange names `prev_version` 0 when the replay brought another
instance's changes, so the copies reload rather than chain onto it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from services.common.bus import subjects
from services.queue.client import QueueClient
from services.router.cluster import RouteReplay
from starling.router.v1.router_pb2 import RouteChange

log = logging.getLogger("starling.router.fencing")
_ATTEMPTS = 3  # a queue holding a higher version: go above it, at most this often


class RouteFence:
    def __init__(
        self, *, queues: QueueClient, nats: Any, replay: RouteReplay | None = None
    ) -> None:
        self._queues = queues
        self._nats = nats
        self._versions: dict[str, int] = {}
        self._fenced: set[str] = set()  # tenants whose version the queues learned from us
        self._locks: dict[str, asyncio.Lock] = {}
        # Several router instances: the store's route events, replayed; None: this one alone.
        self._replay = replay

    def version(self, tenant: str) -> int:
        """The tenant's current version (fixed on first use)."""
        v = self._versions.get(tenant)
        if v is None:
            v = self._versions[tenant] = time.time_ns() // 1000
        return v

    async def _fence(self, tenant: str, version: int) -> int:
        """Every queue instance holds `version` (or, when one held more, a version above
        that); the version they all hold now."""
        for _ in range(_ATTEMPTS):
            held = await self._queues.fence_routes(tenant, version)
            if held == version:
                return version
            version = held + 1
        raise RuntimeError(f"route version of {tenant} keeps moving")

    @asynccontextmanager
    async def change(self, tenant: str) -> AsyncIterator[RouteChange]:
        """Change the tenant's table inside this block, after the queues fenced the new
        version; what the block records in the RouteChange is published when it ends
        without error. Changes of one tenant go one at a time, so versions form a chain."""
        # One lock per tenant that ever changed: as many as tenants, which are bounded.
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            prev = self.version(tenant)
            if self._replay is None:
                new = await self._fence(tenant, max(prev + 1, time.time_ns() // 1000))
                self._versions[tenant] = new
                self._fenced.add(tenant)
                change = RouteChange(tenant=tenant, prev_version=prev, version=new)
                yield change
                await self._publish(change)
                return
            # Several instances: the store first, then the fence, then the replay (module
            # docstring).
            change = RouteChange(tenant=tenant, prev_version=prev)
            yield change
            new = await self._fence(tenant, max(prev + 1, time.time_ns() // 1000))
            mine = {(e.client_id, e.incarnation) for e in (*change.added, *change.removed)} | {
                (d.client_id, d.incarnation) for d in change.dropped
            }
            if await self._replay.replay(tenant, mine):
                change.prev_version = 0  # not a link of the chain the copies hold
            self._versions[tenant] = new
            self._fenced.add(tenant)
            change.version = new
            await self._publish(change)

    async def catch_up(self, tenant: str, refused: int = 0) -> None:
        """Several instances: our version of the tenant was refused (another instance
        changed the table), or we have none yet. Read the version the queues hold, replay
        the store's events, and fence that version at every queue again (a lagging queue
        learns it); if it moved meanwhile, again. Nothing to do if a catch-up under way
        already moved us past `refused`."""
        assert self._replay is not None
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            if tenant in self._fenced and self._versions.get(tenant) != refused:
                return
            for _ in range(_ATTEMPTS):
                held = await self._queues.fence_routes(tenant, 1)  # 1: below every version
                await self._replay.replay(tenant)
                version = held if held > 1 else time.time_ns() // 1000
                if await self._queues.fence_routes(tenant, version) == version:
                    self._versions[tenant] = version
                    self._fenced.add(tenant)
                    return
            raise RuntimeError(f"route version of {tenant} keeps moving")

    async def routing_version(self, tenant: str) -> int:
        """Several instances: the version to check our appends with (caught up first if we
        never were)."""
        if tenant not in self._fenced:
            await self.catch_up(tenant)
        return self._versions[tenant]

    @asynccontextmanager
    async def steady(self, tenant: str) -> AsyncIterator[None]:
        """No change of the tenant is under way inside this block: its version and its
        table belong together (a change sets the new version before it writes the store
        and the table)."""
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            yield

    async def ensure_fenced(self, tenant: str, refused: int = 0) -> None:
        """The queues hold the tenant's current version before a node copies the table:
        fenced again when a node's copy at the current version was refused (the queue lost
        it), or moved up when a queue holds a higher one."""
        current = self.version(tenant)
        if tenant in self._fenced and refused != current:
            return
        if self._replay is not None:
            await self.catch_up(tenant, current)
            return
        held = await self._queues.fence_routes(tenant, current)
        if held == current:
            self._fenced.add(tenant)
            return
        async with self.change(tenant):
            pass  # nothing changes but the version, above the one a queue held

    async def _publish(self, change: RouteChange) -> None:
        try:
            await self._nats.publish(
                subjects.route_changes(change.tenant), change.SerializeToString()
            )
        except Exception:  # copies that miss it are refused by the queue and reload
            log.warning("route_change_publish_failed", extra={"tenant": change.tenant})
