"""Per-tenant queue depth totals (services/queue/depths.py): loaded by a scan, moved by each
write's depth change, only for the partitions owned, and never double-counting a write that
raced a scan."""

from __future__ import annotations

import asyncio
from typing import cast

from services.common.store.ports_queue import QueueChange, QueueStore
from services.queue.core import partition_of
from services.queue.depths import QueueDepths

PARTS = 8


class ScanStore:
    """`depths()` answers `rows`, once `release` is set (to let a write race the scan)."""

    def __init__(self, rows: list[tuple[str, str, int, int]]) -> None:
        self.rows = rows
        self.release = asyncio.Event()
        self.release.set()

    async def depths(self) -> list[tuple[str, str, int, int]]:
        await self.release.wait()
        return list(self.rows)


def _queue_in(partition: int, tenant: str) -> str:
    """A queue id of `tenant` in `partition`."""
    return next(
        q for i in range(10_000) if partition_of(tenant, q := f"c{i}#1", PARTS) == partition
    )


async def test_scan_then_changes_per_owned_partition() -> None:
    owned = {0, 1}
    d = QueueDepths(PARTS, lambda: owned)
    q0, q1, q2 = _queue_in(0, "t"), _queue_in(1, "t"), _queue_in(2, "t")
    store = ScanStore(
        [("t", q0, 3, 30), ("t", q1, 4, 40), ("t", q2, 100, 1000), ("u", _queue_in(0, "u"), 1, 10)]
    )
    assert d.needs_scan()
    await d.scan(cast(QueueStore, store))
    assert not d.needs_scan()
    assert d.by_tenant() == {"t": 7, "u": 1}  # partition 2 is another instance's
    d.begin(0)
    d.end(0, "t", QueueChange(5, 50))  # an append
    d.begin(1)
    d.end(1, "t", QueueChange(-4, -40))  # an ack
    d.begin(2)
    d.end(2, "t", QueueChange(9, 90))  # not ours: its owner counts it
    assert d.by_tenant() == {"t": 8, "u": 1}
    assert d.bytes_by_tenant() == {"t": 80, "u": 10}
    d.lost({1})
    owned.discard(1)
    assert d.by_tenant() == {"t": 8, "u": 1}
    owned.add(1)
    assert d.needs_scan()  # gained again: loaded anew, not from what it had


async def test_a_write_racing_a_scan_is_counted_once() -> None:
    owned = {0}
    d = QueueDepths(PARTS, lambda: owned)
    q = _queue_in(0, "t")
    store = ScanStore([("t", q, 2, 20)])
    await d.scan(cast(QueueStore, store))
    # An append under way when a scan starts commits (depth 2 -> 5) before the scan reads:
    # the scan sees 5, and the append adds its 3 after the scan's answer.
    d.begin(0)
    store.rows = [("t", q, 5, 50)]
    await d.scan(cast(QueueStore, store))
    d.end(0, "t", QueueChange(3, 30))
    assert d.by_tenant() == {"t": 5}
    # An append that starts and ends while a scan runs, which read the row before it.
    store.release.clear()
    scan = asyncio.create_task(d.scan(cast(QueueStore, store)))
    await asyncio.sleep(0)  # the scan is under way (waiting for its rows)
    d.begin(0)
    d.end(0, "t", QueueChange(1, 10))
    store.release.set()
    await scan
    assert d.by_tenant() == {"t": 6}
    store.rows = [("t", q, 6, 60)]
    await d.scan(cast(QueueStore, store))  # a quiet scan confirms it
    assert d.by_tenant() == {"t": 6}
    # Another instance acked 5 of them (it did not own the queue): the next scan takes it in.
    store.rows = [("t", q, 1, 10)]
    await d.scan(cast(QueueStore, store))
    assert d.by_tenant() == {"t": 1}
    store.rows = []
    await d.scan(cast(QueueStore, store))
    assert d.by_tenant() == {}


async def test_held_bytes_adds_appends_under_way_and_other_instances() -> None:
    """What an append's room is computed from: this instance's own bytes, the appends under
    way here, and the other instances' last announcements until they are too old."""
    owned = {0}
    d = QueueDepths(PARTS, lambda: owned)
    await d.scan(cast(QueueStore, ScanStore([("t", _queue_in(0, "t"), 2, 500)])))
    assert d.held_bytes("t", 3.0, now=100.0) == 500
    d.reserve("t", 40)
    d.peer("other-1", {"t": 1000, "u": 7}, now=100.0)
    d.peer("other-2", {"t": 30}, now=98.5)
    assert d.held_bytes("t", 3.0, now=100.0) == 500 + 40 + 1000 + 30
    assert d.held_bytes("u", 3.0, now=100.0) == 7
    d.reserve("t", -40)
    # other-2 not heard for more than 3 s: what it held is no longer counted.
    assert d.held_bytes("t", 3.0, now=101.6) == 500 + 1000
    # A newer announcement replaces the older one (it held less after acks).
    d.peer("other-1", {}, now=101.7)
    assert d.held_bytes("t", 3.0, now=101.8) == 500


async def test_a_gained_partition_is_loaded_before_it_counts() -> None:
    """An append to a partition gained since the last scan loads it first (its queues'
    bytes count from the first append, not from the next round of the scan loop)."""
    owned = {0}
    d = QueueDepths(PARTS, lambda: owned)
    store = ScanStore([("t", _queue_in(0, "t"), 1, 100), ("t", _queue_in(1, "t"), 2, 300)])
    await d.scan(cast(QueueStore, store))
    assert d.held_bytes("t", 3.0) == 100
    owned.add(1)  # gained: not loaded yet
    assert d.held_bytes("t", 3.0) == 100
    await d.load(cast(QueueStore, store), 1)
    assert d.held_bytes("t", 3.0) == 400
    store.rows = []
    await d.load(cast(QueueStore, store), 1)  # loaded already: no scan
    assert d.held_bytes("t", 3.0) == 400
