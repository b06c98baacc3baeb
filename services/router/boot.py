"""How a route table is filled at start: from the latest routing snapshot plus the events
logged after its checkpoint, or (no snapshot yet) from a scan of the subscriptions table plus
the events logged after the scan's position. The router (services/router/main.py) boots with
it; services/router/compaction.py and the `routes-snapshot` Spark job write the snapshots.

Several writers (routers on Cassandra): rows of the log can land out of order, so the replay
of every tenant at once goes only up to the store's stable position (nothing at or below it
can still appear); above it, each tenant that has later events is replayed on its own from
the last event of it applied, along its chain (services/common/store/eventlog.py).

Replaying is exact because a subscription event sets its row's whole state (a subscription
with its options, or its absence): replayed in position order over a table that holds every
change up to the checkpoint (and maybe some after it), the table ends as the subscriptions
table is.

Gaps: compaction prunes the log up to its snapshot's checkpoint. A reader whose position in
a tenant is below what pruning took of it (`EventLog.pruned_through`, read after the events)
has lost events it never applied: it reloads the tenant from the latest snapshot and replays
from that checkpoint (`route_log_gap` in the log, `starling_route_log_gaps` counted). A boot
that a prune overtook starts again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from opentelemetry import metrics

from services.common.gcpause import gc_paused
from services.common.route_table import RouteGrant, RouteTable, SessionKey
from services.common.store.eventlog import EventKind, LogEvent, LoggedSessionStore, subscription_of
from services.common.topics.trie import TopicTrie
from services.router.snapshot import SnapshotFormatError, load_tenant

log = logging.getLogger("starling.router.boot")
PAGE = 10_000  # events read per store call while replaying
GAP_TRIES = 5  # reloads of one tenant (or boots) in a row that a prune overtook
_GAPS = metrics.get_meter("starling.router").create_counter(
    "starling_route_log_gaps",
    description="Route-table reloads from the snapshot because the log was pruned past the "
    "position a router held (a tenant, or a whole boot)",
)


@dataclass(slots=True)
class BootReport:
    source: str  # "snapshot" or "scan"
    checkpoint: int  # the snapshot's checkpoint, or the scan's position
    # Every event at or below it is in the table, and it is stable: a tenant absent from
    # tenant_positions continues from it (services/router/cluster.py).
    position: int
    replayed: int = 0
    seconds: float = 0.0
    # Each tenant's last route event the table holds (tenants with none after the
    # checkpoint: absent).
    tenant_positions: dict[str, int] = field(default_factory=dict)


def apply(table: RouteTable, e: LogEvent) -> None:
    """One route event onto the table (other kinds leave it alone)."""
    if e.kind == EventKind.SUBSCRIBED:
        table.add(subscription_of(e))
    elif e.kind == EventKind.UNSUBSCRIBED:
        table.remove(e.tenant, e.client_id, e.incarnation, e.topic)
    elif e.kind == EventKind.SESSION_DROPPED:
        table.drop(e.tenant, e.client_id, e.incarnation)


async def replay(
    store: LoggedSessionStore,
    table: RouteTable,
    after: int,
    tenant: str | None = None,
    report: BootReport | None = None,
) -> int:
    """Apply every route event above `after` (of one tenant, or all); the last position
    applied (`after` when there was none). Of one tenant, `after` must be the last of its
    events the table holds, or a stable position none of its later events is applied at;
    when pruning took some of them, the tenant is reloaded from the snapshot first (a
    gap, module docstring) and the position returned is at least its checkpoint."""
    for _ in range(GAP_TRIES):
        start = after
        while True:
            events = await store.read_events(after, PAGE, tenant)
            _apply(table, events, report)
            if events:
                after = events[-1].position
            if len(events) < PAGE:
                break
        if tenant is None or not await gap(store, tenant, start):
            return after
        after = await reload_tenant(store, table, tenant)
        if report is not None:
            report.tenant_positions[tenant] = after
    raise RuntimeError(f"the log of {tenant!r} was pruned {GAP_TRIES} times while replayed")


async def gap(store: LoggedSessionStore, tenant: str | None, after: int) -> bool:
    """Whether pruning took events of `tenant` (None: of any) above `after`: read after the
    events were, it covers a prune that ran meanwhile. Logged and counted."""
    pruned = await store.pruned_through(tenant)
    if pruned <= after:
        return False
    log.warning(
        "route_log_gap", extra={"tenant": tenant or "*", "position": after, "pruned": pruned}
    )
    _GAPS.add(1)
    return True


async def reload_tenant(store: LoggedSessionStore, table: RouteTable, tenant: str) -> int:
    """Replace the tenant's routes by the latest snapshot's (none when it has no part of
    the tenant); the snapshot's checkpoint, from which the tenant's log continues. Pruning
    only follows a stored snapshot, so there is one."""
    manifest = await store.latest_snapshot()
    if manifest is None:
        raise RuntimeError("the event log was pruned but no routing snapshot is stored")
    parts: list[bytes] = []
    if tenant in manifest.tenants:
        parts = await store.snapshot_parts(manifest.snapshot_id, tenant)
    with gc_paused():
        if parts:
            load_tenant(table, tenant, parts)
        else:
            table.adopt(tenant, TopicTrie[SessionKey, RouteGrant](), {})
    return manifest.checkpoint


def _apply(table: RouteTable, events: list[LogEvent], report: BootReport | None) -> None:
    with gc_paused():
        for e in events:
            apply(table, e)
            if report is not None:
                report.tenant_positions[e.tenant] = e.position
    if report is not None:
        report.replayed += len(events)


async def replay_all(store: LoggedSessionStore, table: RouteTable, report: BootReport) -> int:
    """Every tenant's route events above the report's checkpoint (a stable position): all
    tenants at once up to the stable position, then tenant by tenant (module docstring). A
    position the table holds every event at or below, stable."""
    settled = max(report.checkpoint, await store.stable_position())
    after = report.checkpoint
    later: set[str] = set()
    while True:
        events = await store.read_events(after, PAGE)
        below = [e for e in events if e.position <= settled]
        _apply(table, below, report)
        later.update(e.tenant for e in events[len(below) :])
        if events:
            after = events[-1].position
        if len(events) < PAGE:
            break
    for tenant in sorted(later):
        await replay(store, table, report.tenant_positions.get(tenant, settled), tenant, report)
    return settled


async def scan(store: LoggedSessionStore, table: RouteTable) -> int:
    """Fill an empty `table` from the subscriptions table, one `add` per row (the boot
    without a snapshot); the log position the rows are as of."""
    position, subs = await store.subscriptions_as_of()
    with gc_paused():
        for rec in subs:
            table.add(rec)
    return position


async def load_snapshot(store: LoggedSessionStore, table: RouteTable) -> int | None:
    """Fill an empty `table` from the latest routing snapshot; its checkpoint, or None when
    there is no snapshot this code can read (the table is left empty)."""
    manifest = await store.latest_snapshot()
    if manifest is None:
        return None
    try:
        for tenant in manifest.tenants:
            parts = await store.snapshot_parts(manifest.snapshot_id, tenant)
            with gc_paused():
                load_tenant(table, tenant, parts)
    except SnapshotFormatError as exc:  # e.g. written by a newer version: scan instead
        log.warning("route_snapshot_unreadable", extra={"error": str(exc)})
        table.clear()
        return None
    return manifest.checkpoint


async def load_routes(store: LoggedSessionStore, table: RouteTable) -> BootReport:
    """Fill an empty `table` (see the module docstring); again from the start when a prune
    took events above the boot's checkpoint while it read them."""
    started = time.perf_counter()
    for _ in range(GAP_TRIES):
        checkpoint = await load_snapshot(store, table)
        if checkpoint is None:
            position = await scan(store, table)
            report = BootReport("scan", position, position)
        else:
            report = BootReport("snapshot", checkpoint, checkpoint)
        report.position = await replay_all(store, table, report)
        if not await gap(store, None, report.checkpoint):
            report.seconds = time.perf_counter() - started
            return report
        table.clear()
    raise RuntimeError(f"the event log was pruned {GAP_TRIES} times during one boot")
