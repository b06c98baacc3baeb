"""The event log and the routing snapshots on Cassandra (`EventLog`), a mixin of the sessions
store so a subscription change and its log row go in one logged batch.

event_log ((tenant, bucket), position): one partition per tenant and hour;
event_log_tenants ((bucket), tenant): which tenants wrote in an hour (readers of every tenant);
event_log_hours ((scope), bucket): the hours that hold events (pruning finds them);
route_snapshots ((scope), snapshot_id DESC): manifests, written last;
route_snapshot_tenants ((snapshot_id), tenant) and route_snapshot_parts ((snapshot_id,
tenant), part): a snapshot's contents, written before its manifest.

event_log_heads ((tenant)): the last route-event position given in the tenant (migration 5).

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
import time
from typing import Any

from services.common.store.cassandra import CassandraBase, _future
from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.eventlog import (
    ROUTE_KINDS,
    WRITER_BITS,
    LogEvent,
    SnapshotManifest,
    bucket_of,
    chained_prefix,
    next_position,
    position_at,
)

SETTLE_MS = 60_000  # a write still in flight after this long has failed (driver timeouts)
POLL_S = (0.005, 0.2)  # first and longest wait for a chained row still on its way
MAX_HEAD_TRIES = 64  # compare-and-sets of one batch's positions against concurrent writers
KEEP_SNAPSHOTS = 2  # the one in force and the one before it (a reader may be loading it)
_SCOPE = "routes"

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


class CassandraEventLog(CassandraBase):
    """`EventLog` on Cassandra (see the module docstring)."""

    def prepare_log(self) -> None:
        p = self._session.prepare
        self._writer = secrets.randbits(WRITER_BITS)
        self._last = 0
        self._log_put = p(
            "INSERT INTO event_log (tenant, bucket, position, kind, client_id, incarnation, "
            "topic, options, data, prev) VALUES (?,?,?,?,?,?,?,?,?,?)"
        )
        self._head_get = p("SELECT position FROM event_log_heads WHERE tenant=?")
        self._head_new = p(
            "INSERT INTO event_log_heads (tenant, position) VALUES (?,?) IF NOT EXISTS"
        )
        self._head_set = p("UPDATE event_log_heads SET position=? WHERE tenant=? IF position=?")
        self._log_tenant = p("INSERT INTO event_log_tenants (bucket, tenant) VALUES (?,?)")
        self._log_hour = p("INSERT INTO event_log_hours (scope, bucket) VALUES (?,?)")
        self._log_read = p(
            "SELECT position, kind, client_id, incarnation, topic, options, data, prev "
            "FROM event_log "
            "WHERE tenant=? AND bucket=? AND position>? LIMIT ?"
        )
        self._log_tenants = p("SELECT tenant FROM event_log_tenants WHERE bucket=?")
        self._log_hours = p("SELECT bucket FROM event_log_hours WHERE scope=? AND bucket<?")
        self._log_drop = p("DELETE FROM event_log WHERE tenant=? AND bucket=?")
        self._log_drop_tenants = p("DELETE FROM event_log_tenants WHERE bucket=?")
        self._log_drop_hour = p("DELETE FROM event_log_hours WHERE scope=? AND bucket=?")
        self._snap_put = p(
            "INSERT INTO route_snapshots (scope, snapshot_id, checkpoint, created_ms) "
            "VALUES (?,?,?,?)"
        )
        self._snap_list = p("SELECT snapshot_id, checkpoint, created_ms FROM route_snapshots "
                            "WHERE scope=?")  # fmt: skip
        self._snap_del = p("DELETE FROM route_snapshots WHERE scope=? AND snapshot_id=?")
        self._snap_tenant_put = p(
            "INSERT INTO route_snapshot_tenants (snapshot_id, tenant, subscriptions, parts) "
            "VALUES (?,?,?,?)"
        )
        self._snap_tenants = p(
            "SELECT tenant, subscriptions, parts FROM route_snapshot_tenants WHERE snapshot_id=?"
        )
        self._snap_tenants_del = p("DELETE FROM route_snapshot_tenants WHERE snapshot_id=?")
        self._part_put = p(
            "INSERT INTO route_snapshot_parts (snapshot_id, tenant, part, data) VALUES (?,?,?,?)"
        )
        self._parts = p("SELECT data FROM route_snapshot_parts WHERE snapshot_id=? AND tenant=?")
        self._parts_del = p("DELETE FROM route_snapshot_parts WHERE snapshot_id=? AND tenant=?")

    async def log_statements(
        self, events: list[LogEvent]
    ) -> tuple[list[tuple[Any, tuple[Any, ...]]], int]:
        """The statements that log `events` (to go in the caller's batch) and the last
        position they take. Route events take their positions from their tenant's head
        (a lightweight transaction per tenant) before anything is written."""
        now = int(time.time() * 1000)
        chained: dict[str, list[int]] = {}
        for e in events:
            if e.kind in ROUTE_KINDS:
                chained.setdefault(e.tenant, []).append(0)
        heads = {t: await self._take(t, len(n), now) for t, n in chained.items()}
        out: list[tuple[Any, tuple[Any, ...]]] = []
        indexed: set[tuple[str, int]] = set()
        last = 0
        for e in events:
            prev: int | None = None
            if e.kind in ROUTE_KINDS:
                prev, position = heads[e.tenant].pop(0)
            else:
                position = self._last = next_position(self._last, now, self._writer)
            last = max(last, position)
            b = bucket_of(position)
            out.append(
                (
                    self._log_put,
                    (e.tenant, b, position, e.kind, e.client_id, e.incarnation, e.topic,
                     e.options, e.data, prev),
                )
            )  # fmt: skip
            if (e.tenant, b) not in indexed:
                indexed.add((e.tenant, b))
                out += [(self._log_tenant, (b, e.tenant)), (self._log_hour, (_SCOPE, b))]
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
        """One logged batch: every statement is applied, or (the coordinator failing before
        the batch log took it) none is."""
        from cassandra.query import BatchStatement, BatchType

        batch = BatchStatement(batch_type=BatchType.LOGGED)
        for stmt, args in statements:
            batch.add(stmt, args)
        await _future(self._session.execute_async(batch))

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
            rows = await self._read_rows(after, limit, tenant)
            ready, waiting = chained_prefix(rows, after, settled)
            if not waiting:
                return [e for e in ready if e.kind in kinds]
            # A route event taken before one we read is still being written: it lands
            # within the driver's timeout, or is given up once settled.
            await asyncio.sleep(wait)
            wait = min(wait * 2, POLL_S[1])

    async def _read_rows(
        self, after: int, limit: int, tenant: str | None
    ) -> list[tuple[LogEvent, int | None]]:
        """Up to `limit` rows of every kind above `after`, by position, each with its
        chain predecessor."""
        out: list[tuple[LogEvent, int | None]] = []
        now_bucket = bucket_of(position_at(int(time.time() * 1000)))
        for b in range(bucket_of(after), now_bucket + 1):
            if tenant is None:
                tenants = [r.tenant for r in await self._exec(self._log_tenants, (b,))]
            else:
                tenants = [tenant]
            for t in tenants:
                out += await self._read_partition(t, b, after, limit)
            if len(out) >= limit:  # later buckets only hold later positions
                break
        out.sort(key=lambda r: r[0].position)
        return out[:limit]

    async def _read_partition(
        self, tenant: str, bucket: int, after: int, limit: int
    ) -> list[tuple[LogEvent, int | None]]:
        out: list[tuple[LogEvent, int | None]] = []
        while len(out) < limit:
            rows = await self._exec(self._log_read, (tenant, bucket, after, limit))
            for r in rows:
                out.append(
                    (
                        LogEvent(tenant, r.kind, r.client_id, r.incarnation, r.topic,
                                 r.options, bytes(r.data or b""), r.position),
                        r.prev,
                    )
                )  # fmt: skip
            if len(rows) < limit:
                break
            after = rows[-1].position
        return out

    async def stable_position(self) -> int:
        return position_at(int(time.time() * 1000) - SETTLE_MS)

    async def prune_events(self, before: int) -> int:
        removed = 0
        for h in await self._exec(self._log_hours, (_SCOPE, bucket_of(before))):
            for t in await self._exec(self._log_tenants, (h.bucket,)):
                await self._exec(self._log_drop, (t.tenant, h.bucket))
                removed += 1  # partitions: Cassandra does not count the rows it deletes
            await self._exec(self._log_drop_tenants, (h.bucket,))
            await self._exec(self._log_drop_hour, (_SCOPE, h.bucket))
        return removed

    async def put_snapshot(
        self, checkpoint: int, parts: dict[str, tuple[int, list[bytes]]]
    ) -> SnapshotManifest:
        created = int(time.time() * 1000)
        known = await self._exec(self._snap_list, (_SCOPE,))
        sid = max([created] + [r.snapshot_id + 1 for r in known])
        # Contents first, the manifest last: a snapshot without its manifest is never read.
        for tenant, (count, blobs) in parts.items():
            for i, blob in enumerate(blobs):
                await self._exec(self._part_put, (sid, tenant, i, blob))
            await self._exec(self._snap_tenant_put, (sid, tenant, count, len(blobs)))
        await self._exec(self._snap_put, (_SCOPE, sid, checkpoint, created))
        for old in sorted((r.snapshot_id for r in known), reverse=True)[KEEP_SNAPSHOTS - 1 :]:
            await self._exec(self._snap_del, (_SCOPE, old))
            for t in await self._exec(self._snap_tenants, (old,)):
                await self._exec(self._parts_del, (old, t.tenant))
            await self._exec(self._snap_tenants_del, (old,))
        tenants = {t: (n, len(b)) for t, (n, b) in parts.items()}
        return SnapshotManifest(sid, checkpoint, created, tenants)

    async def latest_snapshot(self) -> SnapshotManifest | None:
        rows = await self._exec(self._snap_list, (_SCOPE,))
        if not rows:
            return None
        top = rows[0]  # clustering order: newest first
        tenants = {
            r.tenant: (int(r.subscriptions), int(r.parts))
            for r in await self._exec(self._snap_tenants, (top.snapshot_id,))
        }
        return SnapshotManifest(top.snapshot_id, top.checkpoint, top.created_ms, tenants)

    async def snapshot_parts(self, snapshot_id: int, tenant: str) -> list[bytes]:
        return [bytes(r.data) for r in await self._exec(self._parts, (snapshot_id, tenant))]
