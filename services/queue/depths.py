"""Queue depth and held bytes per tenant: the entries waiting in the queues of the
partitions this instance owns and their bytes, summed per tenant, kept in memory (no store
query per report or per append). Depths go to the metrics report; bytes are what the
tenant's max_queued_bytes is checked against, with the other instances' figures.

Theory of operation:
- Each partition's per-tenant totals are loaded from one scan of the store's queue state
  (`QueueStore.depths`): at start, when the instance gains partitions, and every
  `queue_depth_resync_s`. Then every append, ack and drop this instance makes adds the depth
  change its store transaction reports (the queue's own counter after minus before), so the
  totals follow the store's counters instead of counting messages beside them.
- Each instance reports only the partitions it owns, and a partition has one owner, so the
  metrics service's sum over instances counts every queue once (during a hand-over a
  partition can be counted by both or neither for a report or two).
- What this instance does not see is taken in by the periodic scan: an ack served by an
  instance that does not own the queue's partition (a caller whose ownership map was behind),
  the compaction job removing expired entries.
- A scan must not undo or repeat a change of ours that raced it (committed before the scan
  read the row, added to the totals after the scan's result, or the reverse): a loaded
  partition takes the scan's figures only if none of our changes to it was under way or
  started while the scan ran; otherwise it keeps its totals until the next scan. A partition
  not loaded yet takes them in any case (a race there is corrected by a later scan).
- Cluster-wide bytes: every instance announces its per-tenant bytes every
  `queued_bytes_share_s` (NATS), and keeps the others' last announcements for three periods
  (an instance that died stops counting then; its partitions' new owner loads them from the
  store). A tenant's bytes = this instance's own (exact), plus the bytes of appends under
  way here (`reserve`), plus the others' last figures (at most one period old). A partition
  this instance gained (at start, or from an instance that stopped or died) is loaded before
  an append of a tenant with the limit goes to it (`load`), not only by the next round of
  the scan loop: what the queues there hold counts from the first append.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection

from services.common.store.ports_queue import QueueChange, QueueStore
from services.queue.core import partition_of

log = logging.getLogger("starling.queue.depths")


class QueueDepths:
    def __init__(self, partition_count: int, owned: Callable[[], Collection[int]]) -> None:
        """`owned()`: the partitions this instance owns now."""
        self._count = partition_count
        self._owned = owned
        # loaded partition -> tenant -> [depth, bytes]
        self._totals: dict[int, dict[str, list[int]]] = {}
        self._reserved: defaultdict[str, int] = defaultdict(int)  # appends under way: bytes
        # other instance -> (when heard, monotonic; tenant -> bytes)
        self._peers: dict[str, tuple[float, dict[str, int]]] = {}
        self._scanning = asyncio.Lock()
        self._busy: defaultdict[int, int] = defaultdict(int)  # changes under way
        self._started: defaultdict[int, int] = defaultdict(int)  # changes ever started

    def partition(self, tenant: str, queue_id: str) -> int:
        return partition_of(tenant, queue_id, self._count)

    def begin(self, partition: int) -> None:
        """A store write that may change depths in `partition` starts (`end` when done)."""
        self._busy[partition] += 1
        self._started[partition] += 1

    def end(self, partition: int, tenant: str, change: QueueChange) -> None:
        """The write is over; `change`: the depth and bytes change it made (zero when it
        failed)."""
        self._busy[partition] -= 1
        totals = self._totals.get(partition)
        if (change.depth or change.bytes) and totals is not None:
            t = totals.setdefault(tenant, [0, 0])
            t[0] += change.depth
            t[1] += change.bytes

    def reserve(self, tenant: str, n: int) -> None:
        """An append of `n` bytes for `tenant` starts (`reserve(tenant, -n)` when it ended):
        concurrent appends see each other's bytes before they are stored."""
        left = self._reserved[tenant] + n
        if left:
            self._reserved[tenant] = left
        else:
            del self._reserved[tenant]

    def peer(self, instance: str, by_tenant: dict[str, int], now: float | None = None) -> None:
        """Another instance's announcement of its per-tenant bytes."""
        self._peers[instance] = (time.monotonic() if now is None else now, by_tenant)

    def held_bytes(self, tenant: str, ttl_s: float, now: float | None = None) -> int:
        """The tenant's queued bytes cluster-wide as this instance knows them (module doc);
        peers not heard from within `ttl_s` are forgotten."""
        now = time.monotonic() if now is None else now
        total = self._reserved.get(tenant, 0)
        for p in self._owned():
            t = self._totals.get(p, {}).get(tenant)
            if t is not None:
                total += max(0, t[1])
        for instance, (heard, figures) in list(self._peers.items()):
            if now - heard > ttl_s:
                del self._peers[instance]
            else:
                total += figures.get(tenant, 0)
        return total

    def lost(self, partitions: Collection[int]) -> None:
        """This instance no longer owns `partitions`: gained again, they are loaded anew."""
        for p in partitions:
            self._totals.pop(p, None)

    def by_tenant(self) -> dict[str, int]:
        """Entries waiting per tenant in the partitions owned now (tenants that had some
        since the last scan are listed with 0)."""
        return self._sum(0)

    def bytes_by_tenant(self) -> dict[str, int]:
        """Bytes held per tenant in the partitions owned now (what this instance announces)."""
        return {t: n for t, n in self._sum(1).items() if n}

    def _sum(self, i: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self._owned():
            for tenant, t in self._totals.get(p, {}).items():
                out[tenant] = out.get(tenant, 0) + max(0, t[i])
        return out

    def needs_scan(self) -> bool:
        """Whether a partition owned now is not loaded yet."""
        return any(p not in self._totals for p in self._owned())

    async def load(self, store: QueueStore, partition: int) -> None:
        """Have `partition` loaded (a scan if it is not; one at a time)."""
        if partition in self._totals:
            return
        async with self._scanning:
            if partition not in self._totals:
                await self._scan(store)

    async def scan(self, store: QueueStore) -> None:
        """Load every owned partition's totals from the store (see the module doc for when
        a loaded partition keeps its own)."""
        async with self._scanning:
            await self._scan(store)

    async def _scan(self, store: QueueStore) -> None:
        started = dict(self._started)
        busy = {p for p, n in self._busy.items() if n}
        rows = await store.depths()
        fresh: dict[int, dict[str, list[int]]] = defaultdict(dict)
        for tenant, queue_id, depth, held in rows:
            t = fresh[partition_of(tenant, queue_id, self._count)].setdefault(tenant, [0, 0])
            t[0] += depth
            t[1] += held
        owned = set(self._owned())
        for p in list(self._totals):
            if p not in owned:
                del self._totals[p]
        kept = 0
        for p in owned:
            raced = p in busy or self._busy[p] or self._started[p] != started.get(p, 0)
            if raced and p in self._totals:
                kept += 1
                continue
            self._totals[p] = fresh.get(p, {})
        if kept:
            log.debug("queue_depth_scan_kept", extra={"partitions": kept})
