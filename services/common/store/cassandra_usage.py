"""Cassandra `UsageStore`: counter tables in day partitions, since usage rows only grow by
deltas and a tenant's usage must not live in one partition for ever.

Tables (migration 2; docs/storage.md, "usage"):
- `usage_daily` (counters): one partition per (tenant, day), a row per (hour, reporter);
  every summed column is a counter, incremented by each report's delta. At most 24 x the
  reporters rows per partition.
- `usage_peaks`: the hour's maximum of open connections per reporter, same key. A counter
  table cannot hold a maximum, so it is a plain column raised only by lightweight
  transactions (`IF NOT EXISTS`, `IF connections_max < ?`; never a plain write on it),
  skipped when this process already wrote a value as high.
- `usage_topics` (counters): one partition per (tenant, hour), a row per topic reported.
- `usage_days`: one row per (tenant, day) with usage, so `usage` and `topics` find a tenant's
  partitions without a scan (`SELECT DISTINCT` over the whole table was one).

The tenant report reads `usage_daily` joined with `usage_peaks` (the embedded store has both
in one `usage` table). Migration 1's `usage` and `usage_connections` (one partition per
tenant) are no longer written; an operator drops them once reports no longer need them.

Counter increments are not idempotent: a write the driver retries after a timeout may count
twice. Usage figures are for reports and billing estimates, not exact accounting; the
metrics service never retries a failed report's write (the node's next report carries the
counters again, so nothing is lost, at worst a delta is counted twice).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration
from services.common.store.ports_usage import USAGE_SUMMED, TopicDelta, UsageDelta

DAY_MS = 86_400_000
HOUR_MS = 3_600_000

MIGRATIONS = [
    Migration(
        1,
        "usage counters, connection peaks and top topics",
        (
            "CREATE TABLE IF NOT EXISTS usage (tenant text, hour_ms bigint, node_id text, "
            + ", ".join(f"{c} counter" for c in USAGE_SUMMED)
            + ", PRIMARY KEY ((tenant), hour_ms, node_id))",
            """CREATE TABLE IF NOT EXISTS usage_connections (
                 tenant text, hour_ms bigint, node_id text, connections_max bigint,
                 PRIMARY KEY ((tenant), hour_ms, node_id))""",
            """CREATE TABLE IF NOT EXISTS usage_topics (
                 tenant text, hour_ms bigint, topic text, messages counter,
                 PRIMARY KEY ((tenant, hour_ms), topic))""",
        ),
    ),
    Migration(
        2,
        "usage in day partitions",
        (
            "CREATE TABLE IF NOT EXISTS usage_daily (tenant text, day bigint, hour_ms bigint, "
            "node_id text, "
            + ", ".join(f"{c} counter" for c in USAGE_SUMMED)
            + ", PRIMARY KEY ((tenant, day), hour_ms, node_id))",
            """CREATE TABLE IF NOT EXISTS usage_peaks (
                 tenant text, day bigint, hour_ms bigint, node_id text, connections_max bigint,
                 PRIMARY KEY ((tenant, day), hour_ms, node_id))""",
            """CREATE TABLE IF NOT EXISTS usage_days (
                 tenant text, day bigint, PRIMARY KEY ((tenant), day))""",
        ),
    ),
]
_MAX_CACHED = 100_000  # (tenant, hour, reporter) peaks and (tenant, day) keys remembered


def day_of(hour_ms: int) -> int:
    return hour_ms // DAY_MS


class CassandraUsageStore(CassandraBase):
    component = "usage"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._inc = p(
            "UPDATE usage_daily SET "
            + ", ".join(f"{c}={c}+?" for c in USAGE_SUMMED)
            + " WHERE tenant=? AND day=? AND hour_ms=? AND node_id=?"
        )
        self._raise_peak = p(
            "UPDATE usage_peaks SET connections_max=? "
            "WHERE tenant=? AND day=? AND hour_ms=? AND node_id=? IF connections_max < ?"
        )
        self._first_peak = p(
            "INSERT INTO usage_peaks (tenant, day, hour_ms, node_id, connections_max) "
            "VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self._inc_topic = p(
            "UPDATE usage_topics SET messages=messages+? WHERE tenant=? AND hour_ms=? AND topic=?"
        )
        self._day = p("INSERT INTO usage_days (tenant, day) VALUES (?, ?)")
        self._days = p("SELECT day FROM usage_days WHERE tenant=?")
        cols = ", ".join(USAGE_SUMMED)
        self._usage = p(
            f"SELECT tenant, hour_ms, node_id, {cols} FROM usage_daily WHERE tenant=? AND day=?"
        )
        self._peaks = p(
            "SELECT hour_ms, node_id, connections_max FROM usage_peaks WHERE tenant=? AND day=?"
        )
        self._topics = p(
            "SELECT tenant, hour_ms, topic, messages FROM usage_topics WHERE tenant=? AND hour_ms=?"
        )
        self._peak_written: dict[tuple[str, int, str], int] = {}
        self._days_written: set[tuple[str, int]] = set()

    async def add(self, deltas: Sequence[UsageDelta], topics: Sequence[TopicDelta] = ()) -> None:
        for d in deltas:
            await self._mark_day(d.tenant, d.hour_ms)
            await self._exec(
                self._inc,
                (
                    *(getattr(d, c) for c in USAGE_SUMMED),
                    d.tenant,
                    day_of(d.hour_ms),
                    d.hour_ms,
                    d.node_id,
                ),
            )
            if d.connections:
                await self._raise(d)
        for t in topics:
            await self._mark_day(t.tenant, t.hour_ms)
            await self._exec(self._inc_topic, (t.messages, t.tenant, t.hour_ms, t.topic))

    async def _mark_day(self, tenant: str, hour_ms: int) -> None:
        """The (tenant, day) row of `usage_days`, written once per process (idempotent)."""
        key = (tenant, day_of(hour_ms))
        if key in self._days_written:
            return
        await self._exec(self._day, key)
        if len(self._days_written) >= _MAX_CACHED:
            self._days_written.clear()
        self._days_written.add(key)

    async def _raise(self, d: UsageDelta) -> None:
        """connections_max = max(connections_max, d.connections), compare-and-set."""
        key = (d.tenant, d.hour_ms, d.node_id)
        if self._peak_written.get(key, -1) >= d.connections:
            return
        row_key = (d.tenant, day_of(d.hour_ms), d.hour_ms, d.node_id)
        for _ in range(3):  # an insert and an update racing another writer: settle in 3
            (row,) = await self._exec(self._raise_peak, (d.connections, *row_key, d.connections))
            if row[0]:  # [applied]
                break
            current = getattr(row, "connections_max", None)
            if current is not None and current >= d.connections:
                break
            if current is None:  # no row yet
                (ins,) = await self._exec(self._first_peak, (*row_key, d.connections))
                if ins[0]:
                    break
        if len(self._peak_written) >= _MAX_CACHED:
            self._peak_written.clear()
        self._peak_written[key] = d.connections

    async def _tenant_days(self, tenant: str) -> list[int]:
        return sorted(r.day for r in await self._exec(self._days, (tenant,)))

    async def usage(self, tenant: str) -> list[UsageDelta]:
        out = []
        for day in await self._tenant_days(tenant):
            peaks = {
                (r.hour_ms, r.node_id): r.connections_max or 0
                for r in await self._exec(self._peaks, (tenant, day))
            }
            for r in await self._exec(self._usage, (tenant, day)):
                summed = {c: getattr(r, c) or 0 for c in USAGE_SUMMED}
                out.append(
                    UsageDelta(
                        tenant=r.tenant,
                        hour_ms=r.hour_ms,
                        node_id=r.node_id,
                        connections=peaks.get((r.hour_ms, r.node_id), 0),
                        **summed,
                    )
                )
        return sorted(out, key=lambda u: (u.hour_ms, u.node_id))

    async def topics(self, tenant: str) -> list[TopicDelta]:
        # The day's 24 hour partitions of each day the tenant has usage (tests and tools:
        # analytics reads the table through Spark, not through this).
        out: list[TopicDelta] = []
        for day in await self._tenant_days(tenant):
            for h in range(day * DAY_MS, (day + 1) * DAY_MS, HOUR_MS):
                rows = await self._exec(self._topics, (tenant, h))
                out += sorted(
                    (TopicDelta(r.tenant, r.hour_ms, r.topic, r.messages or 0) for r in rows),
                    key=lambda t: t.topic,
                )
        return out
