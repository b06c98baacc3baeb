"""A node's side of the tenant-wide subscription count (a tenant's
`max_tenant_subscriptions`; the count itself: services/common/subscription_counts.py).

Theory of operation: the node's trie is the authority on what its clients hold
(`NodeSubscriptions.counts`). For a tenant with the limit, a SUBSCRIBE's new filters enter
the trie, then ask the quota service for a slot each (`admit`), reporting the node's figure
without them in the same call; the filters not granted are taken out again and refused.
Releases (UNSUBSCRIBE, disconnect) report the node's new figure soon after (`changed`), and
every `SYNC_S` the node reports the tenants whose figure it has not reported since it
changed or since the limit appeared (a limit set while clients already hold subscriptions
counts them within a second). Calls for one tenant are serialized, each carrying the figure
at the time it is sent, so the last one sent is the node's true figure.

Every `HEAL_S` the node reports every limited tenant's figure even unchanged: a count
Redis lost comes back within that.

Without tenants limited the node makes no call. With the quota service unreachable new
filters are admitted (not refused for want of an answer) and reported at the next sync; for
`RETRY_S` after a failed call SUBSCRIBEs do not wait for another (the node's subscription
operations are ordered: one waiting on a timeout would hold up every client's SUBACK).
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.common.limits_copies import LimitsCopies
from services.common.tasks import TaskSet
from services.quota.client import QuotaClient

log = logging.getLogger("starling.connection.subscription_slots")

SYNC_S = 1.0
HEAL_S = 30.0
RETRY_S = 1.0


class SubscriptionSlots:
    def __init__(
        self,
        client: QuotaClient,
        node_id: str,
        limits: LimitsCopies,
        counts: dict[str, int],
    ) -> None:
        """`counts`: tenant -> what the node's clients of it hold now (its trie's
        `NodeSubscriptions.counts`, kept up to date by it)."""
        self._client = client
        self._node_id = node_id
        self._limits = limits
        self._counts = counts
        self._locks: dict[str, asyncio.Lock] = {}
        self._reported: dict[str, int] = {}  # tenant -> the figure last reported
        self._dirty: set[str] = set()  # tenants whose figure changed since last reported
        self._tasks = TaskSet()
        self._loop: asyncio.Task[None] | None = None
        self._failing = False
        self._failed_at = -1e18

    def _limited(self, tenant: str) -> bool:
        return self._limits.get(tenant).limits.max_tenant_subscriptions > 0

    async def admit(self, tenant: str, new: int) -> int:
        """How many of `new` filters (already in the trie) may stay."""
        if not (await self._limits.fetch(tenant)).limits.max_tenant_subscriptions:
            return new  # reported by `sync` if a limit appears
        if self._failing and time.monotonic() - self._failed_at < RETRY_S:
            self._dirty.add(tenant)
            return new
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            held = max(0, self._counts.get(tenant, 0) - new)
            try:
                granted, _ = await self._client.hold_subscriptions(tenant, self._node_id, held, new)
            except Exception as exc:
                self._unreachable(exc)
                self._dirty.add(tenant)
                return new
            self._failing = False
            self._reported[tenant] = held + granted
            return min(new, granted)

    def changed(self, tenant: str) -> None:
        """The node's clients of `tenant` dropped filters: report the new figure soon."""
        self._dirty.add(tenant)
        if tenant in self._reported and tenant not in self._locks_busy():
            self._tasks.spawn(self._report(tenant), name="subscription-slots")

    def _locks_busy(self) -> set[str]:
        return {t for t, lock in self._locks.items() if lock.locked()}

    async def _report(self, tenant: str) -> None:
        async with self._locks.setdefault(tenant, asyncio.Lock()):
            if tenant not in self._dirty:
                return  # reported meanwhile
            self._dirty.discard(tenant)
            held = self._counts.get(tenant, 0)
            try:
                await self._client.hold_subscriptions(tenant, self._node_id, held, 0)
            except Exception as exc:
                self._unreachable(exc)
                self._dirty.add(tenant)
                return
            self._failing = False
            if held or self._limited(tenant):
                self._reported[tenant] = held
            else:
                self._reported.pop(tenant, None)

    def _unreachable(self, exc: Exception) -> None:
        if not self._failing:
            log.warning("subscription_slots_unavailable", extra={"error": type(exc).__name__})
        self._failing = True
        self._failed_at = time.monotonic()

    async def sync(self, everything: bool = False) -> None:
        """Report every tenant whose figure changed or that became limited since its last
        report (a tenant no longer limited: until it is reported holding none);
        `everything`: every limited tenant."""
        for tenant in list(self._counts.keys() | self._reported.keys()):
            due = everything or self._reported.get(tenant) != self._counts.get(tenant, 0)
            if due and (tenant in self._reported or self._limited(tenant)):
                self._dirty.add(tenant)
                await self._report(tenant)

    async def _run(self) -> None:
        healed = time.monotonic()
        while True:
            await asyncio.sleep(SYNC_S)
            heal = time.monotonic() - healed >= HEAL_S
            if heal:
                healed = time.monotonic()
            try:
                await self.sync(everything=heal)
            except Exception:  # keep syncing; one failed round must not stop it
                log.exception("subscription_slots_sync_failed")

    def start(self) -> None:
        self._loop = asyncio.create_task(self._run(), name="subscription-slots-sync")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        await self._tasks.cancel()
        await self._client.close()
