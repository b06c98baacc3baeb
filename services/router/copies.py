"""What a connection node's copy of a tenant's route table (services/connection/replica.py)
is loaded from: the tenant's part of the latest routing snapshot and the tenant's route
events logged after its checkpoint, up to the position the router's table is at. The router
reads both from the store and passes them on undecoded; the node loads the snapshot at
about 1 µs per subscription (services/router/snapshot.py) and replays the tail, where it
used to add every entry the router encoded one by one.

The router knows the log position of its table per tenant: the boot's position, then the
position each of its own subscription writes took (only the router writes subscriptions,
one change of a tenant at a time, services/router/fencing.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.store.eventlog import LogEvent, LoggedSessionStore

PAGE = 10_000  # events read per store call
# A tail longer than this and than the tenant's table: sending the entries is cheaper.
MIN_TAIL_LIMIT = 1_000


class TablePositions:
    """Per tenant, the log position the router's table is at: every route event of the
    tenant at or below it is in the table, none above it."""

    def __init__(self) -> None:
        self._booted = 0
        self._last: dict[str, int] = {}

    def booted(self, position: int) -> None:
        self._booted = position

    def logged(self, tenant: str, position: int) -> None:
        """A subscription write of the tenant took `position` (and the table has it)."""
        if position > self._last.get(tenant, 0):
            self._last[tenant] = position

    def of(self, tenant: str) -> int:
        return max(self._booted, self._last.get(tenant, 0))


@dataclass(frozen=True, slots=True)
class SnapshotAndTail:
    parts: list[bytes]  # empty: the tenant had no subscription at the checkpoint
    tail: list[LogEvent]


async def read_snapshot_and_tail(
    store: LoggedSessionStore, tenant: str, position: int, subscriptions: int
) -> SnapshotAndTail | None:
    """The tenant's table at `position` as the latest snapshot plus the tail; None when it
    cannot be had that way (no snapshot, one newer than `position`, a tail too long, or a
    newer snapshot's pruning may have taken part of the tail)."""
    manifest = await store.latest_snapshot()
    if manifest is None or manifest.checkpoint > position:
        return None
    parts: list[bytes] = []
    if tenant in manifest.tenants:
        parts = await store.snapshot_parts(manifest.snapshot_id, tenant)
    limit = max(MIN_TAIL_LIMIT, subscriptions)
    tail: list[LogEvent] = []
    after = manifest.checkpoint
    while after < position:
        events = await store.read_events(after, PAGE, tenant)
        tail += [e for e in events if e.position <= position]
        if len(tail) > limit:
            return None
        if len(events) < PAGE:
            break
        after = events[-1].position
    # Read after the tail: a prune that took any of it (a newer snapshot's, meanwhile)
    # shows here.
    if await store.pruned_through(tenant) > manifest.checkpoint:
        return None
    return SnapshotAndTail(parts, tail)
