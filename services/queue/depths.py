"""Queue depth per tenant for the metrics report: the entries waiting in the queues of the
partitions this instance owns, summed per tenant, kept in memory (no store query per report).

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
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection

from services.common.store.ports import QueueStore
from services.queue.core import partition_of

log = logging.getLogger("starling.queue.depths")


class QueueDepths:
    def __init__(self, partition_count: int, owned: Callable[[], Collection[int]]) -> None:
        """`owned()`: the partitions this instance owns now."""
        self._count = partition_count
        self._owned = owned
        self._totals: dict[int, dict[str, int]] = {}  # loaded partition -> tenant -> depth
        self._busy: defaultdict[int, int] = defaultdict(int)  # changes under way
        self._started: defaultdict[int, int] = defaultdict(int)  # changes ever started

    def partition(self, tenant: str, queue_id: str) -> int:
        return partition_of(tenant, queue_id, self._count)

    def begin(self, partition: int) -> None:
        """A store write that may change depths in `partition` starts (`end` when done)."""
        self._busy[partition] += 1
        self._started[partition] += 1

    def end(self, partition: int, tenant: str, change: int) -> None:
        """The write is over; `change`: the depth change it made (0 when it failed)."""
        self._busy[partition] -= 1
        totals = self._totals.get(partition)
        if change and totals is not None:
            totals[tenant] = totals.get(tenant, 0) + change

    def lost(self, partitions: Collection[int]) -> None:
        """This instance no longer owns `partitions`: gained again, they are loaded anew."""
        for p in partitions:
            self._totals.pop(p, None)

    def by_tenant(self) -> dict[str, int]:
        """Entries waiting per tenant in the partitions owned now (tenants that had some
        since the last scan are listed with 0)."""
        out: dict[str, int] = {}
        for p in self._owned():
            for tenant, n in self._totals.get(p, {}).items():
                out[tenant] = out.get(tenant, 0) + max(0, n)
        return out

    def needs_scan(self) -> bool:
        """Whether a partition owned now is not loaded yet."""
        return any(p not in self._totals for p in self._owned())

    async def scan(self, store: QueueStore) -> None:
        """Load every owned partition's totals from the store (see the module doc for when
        a loaded partition keeps its own)."""
        started = dict(self._started)
        busy = {p for p, n in self._busy.items() if n}
        rows = await store.depths()
        fresh: dict[int, dict[str, int]] = defaultdict(dict)
        for tenant, queue_id, depth in rows:
            per = fresh[partition_of(tenant, queue_id, self._count)]
            per[tenant] = per.get(tenant, 0) + depth
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
