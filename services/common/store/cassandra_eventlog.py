"""The event log and the routing snapshots on Cassandra (`EventLog`), a mixin of the sessions
store: a subscription change and its log row go in one logged batch (split by size).

Tables (docs/storage.md, "Event log", has the sizes and consistency levels):
event_log_slices ((tenant, slice), position): the events, a partition per tenant, minute and
  shard (route events in shard 0), `bucket` (the hour) kept for reports;
event_log_heads ((tenant)): the last route-event position given in the tenant (the chain);
the indexes that find slices and the pruning watermark: cassandra_eventlog_index.py;
route_snapshots, route_snapshot_tenants, route_snapshot_parts: cassandra_snapshots.py.
No partition is written by every SUBSCRIBE of the cluster; readers read only slices that
exist. event_log, event_log_tenants and event_log_hours (migration 4, one partition per
tenant and hour) are no longer written; their rows are still read and pruned.

Positions come from each writer's clock with a per-process writer id in the low bits
(eventlog.next_position). Route events (what the route tables replay) form a chain per
tenant, so several routers can write them: their positions are taken with a lightweight
transaction on the tenant's head row (one per batch, whatever its size; a lost race reads
the head the winner set and tries again), and each row keeps `prev`, the position taken just
before it. Rows can land out of order (taken, then written), so `read_events` returns a
tenant's route events only along the chain and waits, polling, for a row taken but not yet
written (eventlog.chained_prefix); after `SETTLE_MS` such a row is given up (its writer died
in between). Other kinds (reports) take clock positions without a transaction. The stable
position (what a snapshot may take as its checkpoint) is the position of `SETTLE_MS` ago,
longer than any write is retried.

Reads of every tenant (`tenant` None) are exact only up to the stable position; above it a
reader must continue tenant by tenant from the last event of each it applied
(services/router/boot.py does).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from services.common.clock import now_ms
from services.common.store.cassandra import _future
from services.common.store.cassandra_eventlog_index import CassandraLogIndex, slice_of
from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.eventlog import (
    ROUTE_KINDS,
    WRITER_BITS,
    LogEvent,
    bucket_of,
    chained_prefix,
    next_position,
    position_at,
)

SETTLE_MS = 60_000  # a write still in flight after this long has failed (driver timeouts)
POLL_S = (0.005, 0.2)  # first and longest wait for a chained row still on its way
MAX_HEAD_TRIES = 64  # compare-and-sets of one batch's positions against concurrent writers
# A logged batch stays under Cassandra's warning size (batch_size_warn_threshold 5 KiB;
# 50 KiB is refused): a larger change goes in several batches, in order.
BATCH_BYTES = 4 << 10

MIGRATION = Migration(
    4,
    "event log and routing snapshots",
    (
        """CREATE TABLE IF NOT EXISTS event_log (
         tenant text, bucket bigint, position bigint, kind text, client_id text,
         incarnation bigint, topic text, options bigint, data blob,
         PRIMARY KEY ((tenant, bucket), position))""",
        """CREATE TABLE IF NOT EXISTS event_log_tenants (
         bucket bigint, tenant text, PRIMARY KEY ((bucket), tenant))""",
        """CREATE TABLE IF NOT EXISTS event_log_hours (
         scope text, bucket bigint, PRIMARY KEY ((scope), bucket))""",
        """CREATE TABLE IF NOT EXISTS route_snapshots (
         scope text, snapshot_id bigint, checkpoint bigint, created_ms bigint,
         PRIMARY KEY ((scope), snapshot_id)) WITH CLUSTERING ORDER BY (snapshot_id DESC)""",
        """CREATE TABLE IF NOT EXISTS route_snapshot_tenants (
         snapshot_id bigint, tenant text, subscriptions bigint, parts int,
         PRIMARY KEY ((snapshot_id), tenant))""",
        """CREATE TABLE IF NOT EXISTS route_snapshot_parts (
         snapshot_id bigint, tenant text, part int, data blob,
         PRIMARY KEY ((snapshot_id, tenant), part))""",
    ),
)


# Route events chained per tenant (module docstring).
CHAIN_MIGRATION = Migration(
    5,
    "event log chain for several writers",
    (
        AddColumn("event_log", "prev", "bigint"),
        "CREATE TABLE IF NOT EXISTS event_log_heads (tenant text PRIMARY KEY, position bigint)",
    ),
)

# Bounded partitions: slices, their indexes, the pruning watermark (module docstring and
# cassandra_eventlog_index.py). Version 7: the sessions store's migration 6 came first.
INDEX_MIGRATION = Migration(
    7,
    "event log in minute slices, indexes by day and tenant, pruning watermark",
    (
        """CREATE TABLE IF NOT EXISTS event_log_slices (
         tenant text, slice bigint, position bigint, bucket bigint, kind text,
         client_id text, incarnation bigint, topic text, options bigint, data blob,
         prev bigint, PRIMARY KEY ((tenant, slice), position))""",
        """CREATE TABLE IF NOT EXISTS event_log_days (
         scope text, day bigint, PRIMARY KEY ((scope), day))""",
        """CREATE TABLE IF NOT EXISTS event_log_index (
         day bigint, ishard int, bucket bigint, tenant text,
         PRIMARY KEY ((day, ishard), bucket, tenant))""",
        """CREATE TABLE IF NOT EXISTS event_log_tenant_hours (
         tenant text, bucket bigint, PRIMARY KEY ((tenant), bucket))""",
        """CREATE TABLE IF NOT EXISTS event_log_slice_index (
         tenant text, bucket bigint, slice bigint, PRIMARY KEY ((tenant, bucket), slice))""",
        """CREATE TABLE IF NOT EXISTS event_log_pruned (
         tenant text, position bigint, PRIMARY KEY ((tenant), position))""",
    ),
)


def _value_bytes(args: tuple[Any, ...]) -> int:
    """About what a statement's values weigh in a batch (what Cassandra's limit counts)."""
    return sum(len(a) if isinstance(a, str | bytes) else 8 for a in args) + 16


def split_batches(
    statements: list[tuple[Any, tuple[Any, ...]]], limit: int = BATCH_BYTES
) -> list[list[tuple[Any, tuple[Any, ...]]]]:
    """`statements` in order, cut into batches of at most `limit` bytes of values (a larger
    statement alone)."""
    out: list[list[tuple[Any, tuple[Any, ...]]]] = []
    size = limit
    for stmt in statements:
        n = _value_bytes(stmt[1])
        if size + n > limit:
            out.append([])
            size = 0
        out[-1].append(stmt)
        size += n
    return out


class CassandraEventLog(CassandraLogIndex):
    """`EventLog` on Cassandra (see the module docstring)."""

    def prepare_log(self) -> None:
        p = self._session.prepare
        self._writer = secrets.randbits(WRITER_BITS)
        self._last = 0
        self._log_put = p(
            "INSERT INTO event_log_slices (tenant, slice, position, bucket, kind, client_id, "
            "incarnation, topic, options, data, prev) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
        )
        self._head_get = p("SELECT position FROM event_log_heads WHERE tenant=?")
        self._head_new = p(
            "INSERT INTO event_log_heads (tenant, position) VALUES (?,?) IF NOT EXISTS"
        )
        self._head_set = p("UPDATE event_log_heads SET position=? WHERE tenant=? IF position=?")
        self.prepare_index()
        self.prepare_snapshots()

    async def log_statements(
        self, events: list[LogEvent]
    ) -> tuple[list[tuple[Any, tuple[Any, ...]]], int]:
        """The statements that log `events` (to go in the caller's batch, `run_batch`) and
        the last position they take. Route events take their positions from their tenant's
        head (a lightweight transaction per tenant); the index rows are written before
        anything is returned."""
        now = now_ms()
        chained: dict[str, int] = {}
        for e in events:
            if e.kind in ROUTE_KINDS:
                chained[e.tenant] = chained.get(e.tenant, 0) + 1
        heads = {t: await self._take(t, n, now) for t, n in chained.items()}
        out: list[tuple[Any, tuple[Any, ...]]] = []
        last = 0
        for e in events:
            prev: int | None = None
            if e.kind in ROUTE_KINDS:
                prev, position = heads[e.tenant].pop(0)
            else:
                position = self._last = next_position(self._last, now, self._writer)
            last = max(last, position)
            s = slice_of(position, e.kind, e.client_id or e.topic)
            out.append(
                (
                    self._log_put,
                    (e.tenant, s, position, bucket_of(position), e.kind, e.client_id,
                     e.incarnation, e.topic, e.options, e.data, prev),
                )
            )  # fmt: skip
        await self.index_slices({(a[0], a[1]) for _, a in out})
        return out, last

    async def _take(self, tenant: str, n: int, now: int) -> list[tuple[int, int]]:
        """`n` consecutive links of the tenant's chain, as (prev, position): a
        compare-and-set of its head from the value read to the last position taken."""
        rows = await self._exec(self._head_get, (tenant,))
        head: int | None = rows[0].position if rows else None
        for _ in range(MAX_HEAD_TRIES):
            links: list[tuple[int, int]] = []
            prev = head or 0
            for _ in range(n):
                self._last = next_position(max(self._last, prev), now, self._writer)
                links.append((prev, self._last))
                prev = self._last
            if head is None:
                res = await self._exec(self._head_new, (tenant, prev))
            else:
                res = await self._exec(self._head_set, (prev, tenant, head))
            if res[0][0]:  # [applied]
                return links
            head = res[0].position  # the head another writer set: chain after it
        raise RuntimeError(f"event log head of {tenant!r} lost {MAX_HEAD_TRIES} compare-and-sets")

    async def run_batch(self, statements: list[tuple[Any, tuple[Any, ...]]]) -> None:
        """Logged batches of at most BATCH_BYTES, in order: each is applied whole or (its
        coordinator failing before the batch log took it) not at all. A change that fits
        one (a SUBSCRIBE of a few filters) is atomic with its log rows; a larger one is
        written log rows first, and a failure part-way makes the caller's change fail (its
        retry writes every row again: each sets its row's whole state)."""
        for part in split_batches(statements):
            await _future(self._session.execute_async(self._batch(part)))

    async def append_events(self, events: list[LogEvent]) -> int:
        if not events:
            return 0
        statements, last = await self.log_statements(events)
        await self.run_batch(statements)
        return last

    async def read_events(
        self,
        after: int,
        limit: int,
        tenant: str | None = None,
        kinds: frozenset[str] = ROUTE_KINDS,
    ) -> list[LogEvent]:
        wait = POLL_S[0]
        while True:
            settled = await self.stable_position()
            rows = await self.read_rows(after, limit, tenant, kinds <= ROUTE_KINDS)
            ready, waiting = chained_prefix(rows, after, settled)
            if not waiting:
                return [e for e in ready if e.kind in kinds]
            # A route event taken before one we read is still being written: it lands
            # within the driver's timeout, or is given up once settled.
            await asyncio.sleep(wait)
            wait = min(wait * 2, POLL_S[1])

    async def stable_position(self) -> int:
        return position_at(now_ms() - SETTLE_MS)
