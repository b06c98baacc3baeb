"""Where the Cassandra event log's rows are and how they go (a mixin of
cassandra_eventlog.py's CassandraEventLog): the slice a row is written to, the indexes that
find slices, reading a position range through them, and pruning with its watermark.

Slices: event_log_slices ((tenant, slice), position), `slice` = minute * SHARDS + shard.
Route events (the chain routers replay, bounded by its compare-and-set per batch) are all
in shard 0 of their minute, so a router reads no report rows; the other kinds (connection
events, retained records: the busy ones) spread over shards 1..SHARDS-1 by client id (or
topic). Indexes, each row written once per writer process (it remembers what it indexed)
and before the rows it points to, so a reader that finds a row finds its index entry:
event_log_days ((scope), day); event_log_index ((day, ishard), bucket, tenant): a day's
(hour, tenant) pairs over INDEX_SHARDS partitions; event_log_tenant_hours ((tenant),
bucket); event_log_slice_index ((tenant, bucket), slice). A log from before migration 7
(event_log ((tenant, bucket), position), indexed by event_log_tenants and event_log_hours)
is still read and pruned, never written.
"""

from __future__ import annotations

import zlib
from typing import Any

from services.common.clock import now_ms
from services.common.store.cassandra_snapshots import CassandraSnapshots
from services.common.store.eventlog import (
    BUCKET_MS,
    ROUTE_KINDS,
    LogEvent,
    bucket_of,
    position_at,
    position_ms,
)

SLICE_MS = 60_000  # a slice's time span: one minute
SHARDS = 16  # per minute and tenant: shard 0 for route events, the rest for other kinds
INDEX_SHARDS = 16  # partitions of a day's (hour, tenant) index
HOURS_PER_DAY = 24
SCOPE = "routes"
_ANY = ""  # event_log_pruned's row for every tenant
_FORGET_AT = 100_000  # index entries a writer remembers before it forgets old hours

Row = tuple[LogEvent, int | None]  # an event and its chain predecessor (None: no chain)


def slice_of(position: int, kind: str, key: str) -> int:
    """The slice an event is written to (module docstring); `key`: its client id or topic."""
    minute = position_ms(position) // SLICE_MS
    shard = 0 if kind in ROUTE_KINDS else 1 + zlib.crc32(key.encode()) % (SHARDS - 1)
    return minute * SHARDS + shard


def _first_slice(after: int) -> int:
    return position_ms(after) // SLICE_MS * SHARDS


def _ishard(tenant: str) -> int:
    return zlib.crc32(tenant.encode()) % INDEX_SHARDS


class CassandraLogIndex(CassandraSnapshots):
    def prepare_index(self) -> None:
        p = self._session.prepare
        self._indexed: set[tuple[str, int, int]] = set()  # (tenant, hour, slice); day: "", d
        self._day_put = p("INSERT INTO event_log_days (scope, day) VALUES (?,?)")
        self._index_put = p(
            "INSERT INTO event_log_index (day, ishard, bucket, tenant) VALUES (?,?,?,?)"
        )
        self._th_put = p("INSERT INTO event_log_tenant_hours (tenant, bucket) VALUES (?,?)")
        self._si_put = p("INSERT INTO event_log_slice_index (tenant, bucket, slice) VALUES (?,?,?)")
        self._days = p("SELECT day FROM event_log_days WHERE scope=? AND day>=?")
        self._index = p(
            "SELECT bucket, tenant FROM event_log_index WHERE day=? AND ishard=? AND bucket>=?"
        )
        self._th = p("SELECT bucket FROM event_log_tenant_hours WHERE tenant=? AND bucket>=?")
        self._si = p(
            "SELECT slice FROM event_log_slice_index WHERE tenant=? AND bucket=? AND slice>=?"
        )
        cols = "position, kind, client_id, incarnation, topic, options, data, prev"
        self._slice_read = p(
            f"SELECT {cols} FROM event_log_slices WHERE tenant=? AND slice=? AND position>? LIMIT ?"
        )
        self._old_read = p(
            f"SELECT {cols} FROM event_log WHERE tenant=? AND bucket=? AND position>? LIMIT ?"
        )
        self._old_tenants = p("SELECT tenant FROM event_log_tenants WHERE bucket=?")
        self._old_hours = p("SELECT bucket FROM event_log_hours WHERE scope=? AND bucket>=?")
        self._slice_drop = p("DELETE FROM event_log_slices WHERE tenant=? AND slice=?")
        self._si_drop = p("DELETE FROM event_log_slice_index WHERE tenant=? AND bucket=?")
        self._old_drop = p("DELETE FROM event_log WHERE tenant=? AND bucket=?")
        self._th_drop = p("DELETE FROM event_log_tenant_hours WHERE tenant=? AND bucket<=?")
        self._index_drop = p("DELETE FROM event_log_index WHERE day=? AND ishard=? AND bucket<=?")
        self._day_drop = p("DELETE FROM event_log_days WHERE scope=? AND day=?")
        self._old_drop_tenants = p("DELETE FROM event_log_tenants WHERE bucket=?")
        self._old_drop_hour = p("DELETE FROM event_log_hours WHERE scope=? AND bucket=?")
        self._heads_get = p("SELECT position FROM event_log_heads WHERE tenant=?")
        self._pruned_put = p("INSERT INTO event_log_pruned (tenant, position) VALUES (?,?)")
        self._pruned_get = p("SELECT position FROM event_log_pruned WHERE tenant=?")
        self._pruned_trim = p("DELETE FROM event_log_pruned WHERE tenant=? AND position<?")

    async def index_slices(self, slices: set[tuple[str, int]]) -> None:
        """Index (tenant, slice) pairs this process has not indexed yet (idempotent writes,
        to be awaited before the rows are written)."""
        for tenant, s in sorted(slices):
            b = s // SHARDS * SLICE_MS // BUCKET_MS
            if (tenant, b, s) in self._indexed:
                continue
            if (tenant, b, -1) not in self._indexed:
                day = b // HOURS_PER_DAY
                if ("", day, -1) not in self._indexed:
                    await self._exec(self._day_put, (SCOPE, day))
                    self._indexed.add(("", day, -1))
                await self._exec(self._index_put, (day, _ishard(tenant), b, tenant))
                await self._exec(self._th_put, (tenant, b))
                self._indexed.add((tenant, b, -1))
            await self._exec(self._si_put, (tenant, b, s))
            self._indexed.add((tenant, b, s))
        if len(self._indexed) > _FORGET_AT:  # indexing again is harmless
            hour = bucket_of(position_at(now_ms()))
            self._indexed = {k for k in self._indexed if k[1] >= hour - 1}

    async def _hours(self, after: int, tenant: str | None) -> dict[int, dict[str, bool]]:
        """The hours from `after`'s on that hold events (of `tenant`, or of any): per hour,
        its tenants, each with whether the hour is in the pre-slices table."""
        first = bucket_of(after)
        out: dict[int, dict[str, bool]] = {}
        if tenant is not None:
            for r in await self._exec(self._th, (tenant, first)):
                out.setdefault(r.bucket, {})[tenant] = False
        else:
            for d in await self._exec(self._days, (SCOPE, first // HOURS_PER_DAY)):
                for ishard in range(INDEX_SHARDS):
                    for r in await self._exec(self._index, (d.day, ishard, first)):
                        out.setdefault(r.bucket, {})[r.tenant] = False
        for r in await self._exec(self._old_hours, (SCOPE, first)):
            if tenant is not None:
                out.setdefault(r.bucket, {})[tenant] = True
            else:
                for t in await self._exec(self._old_tenants, (r.bucket,)):
                    out.setdefault(r.bucket, {})[t.tenant] = True
        return out

    async def read_rows(
        self, after: int, limit: int, tenant: str | None, routes_only: bool
    ) -> list[Row]:
        """Up to `limit` rows above `after` (route events only, or of every kind), by
        position, each with its chain predecessor."""
        out: list[Row] = []
        hours = await self._hours(after, tenant)
        for b in sorted(hours):
            for t, old in sorted(hours[b].items()):
                if old:
                    out += await self._read_part(self._old_read, t, b, after, limit)
                for s in await self._exec(self._si, (t, b, _first_slice(after))):
                    if not routes_only or s.slice % SHARDS == 0:
                        out += await self._read_part(self._slice_read, t, s.slice, after, limit)
            if len(out) >= limit:  # later hours only hold later positions
                break
        out.sort(key=lambda r: r[0].position)
        return out[:limit]

    async def _read_part(
        self, stmt: Any, tenant: str, key: int, after: int, limit: int
    ) -> list[Row]:
        out: list[Row] = []
        while len(out) < limit:
            rows = await self._exec(stmt, (tenant, key, after, limit))
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

    async def prune_events(self, before: int) -> int:
        """Whole hours at or below `before`: the watermark of each of their tenants is
        raised before any partition goes, then the partitions, then the index rows (a
        reader meanwhile reads an emptied partition, never misses one). A tenant's
        watermark is its chain's head, or the end of the last pruned hour when the head
        is later: at or above every route event of it pruned, below every one kept."""
        last_hour = bucket_of(before + 1) - 1  # the last hour wholly at or below `before`
        hours = {b: ts for b, ts in (await self._hours(0, None)).items() if b <= last_hour}
        tenants = sorted({t for ts in hours.values() for t in ts})
        hour_end = position_at((last_hour + 1) * BUCKET_MS) - 1
        top = 0
        for t in tenants:
            rows = await self._exec(self._heads_get, (t,))
            if rows and rows[0].position:  # route events: a chain
                top = max(top, min(rows[0].position, hour_end))
                await self._raise_pruned(t, min(rows[0].position, hour_end))
        if top:
            await self._raise_pruned(_ANY, top)
        removed = 0
        for b, ts in sorted(hours.items()):
            for t, old in sorted(ts.items()):
                if old:
                    await self._exec(self._old_drop, (t, b))
                for s in await self._exec(self._si, (t, b, 0)):
                    await self._exec(self._slice_drop, (t, s.slice))
                await self._exec(self._si_drop, (t, b))
                removed += 1  # (tenant, hour)s: Cassandra does not count deleted rows
            await self._exec(self._old_drop_tenants, (b,))
            await self._exec(self._old_drop_hour, (SCOPE, b))
        await self._prune_index(tenants, {b // HOURS_PER_DAY for b in hours}, last_hour)
        return removed

    async def _prune_index(self, tenants: list[str], days: set[int], last_hour: int) -> None:
        """One range tombstone per index partition."""
        for t in tenants:
            await self._exec(self._th_drop, (t, last_hour))
        for day in sorted(days):
            for ishard in range(INDEX_SHARDS):
                await self._exec(self._index_drop, (day, ishard, last_hour))
            if (day + 1) * HOURS_PER_DAY - 1 <= last_hour:  # the whole day went
                await self._exec(self._day_drop, (SCOPE, day))

    async def _raise_pruned(self, tenant: str, position: int) -> None:
        """The watermark only grows, even with two prunes racing: a row per raise, the
        highest counts; the lower ones go (one range tombstone a raise)."""
        await self._exec(self._pruned_put, (tenant, position))
        await self._exec(self._pruned_trim, (tenant, position))

    async def pruned_through(self, tenant: str | None = None) -> int:
        rows = await self._exec(self._pruned_get, (_ANY if tenant is None else tenant,))
        return max((int(r.position) for r in rows), default=0)
