"""Cassandra `UsageStore`: counter tables, since usage rows only grow by deltas.

- `usage` (counters): one partition per tenant, a row per (hour, reporter); every summed
  column is a counter, incremented by each report's delta.
- `usage_connections`: the hour's maximum of open connections per reporter. A counter table
  cannot hold a maximum, so it is a plain column raised with a lightweight transaction
  (`IF connections_max < ?`), skipped when this process already wrote a value as high.
- `usage_topics` (counters): one partition per (tenant, hour), a row per topic.

Counter increments are not idempotent: a write the driver retries after a timeout may count
twice. Usage figures are for reports and billing estimates, not exact accounting; the
metrics service never retries a failed report's write (the node's next report carries the
counters again, so nothing is lost, at worst a delta is counted twice).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration
from services.common.store.ports import USAGE_SUMMED, TopicDelta, UsageDelta

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
    )
]
_MAX_PEAKS_CACHED = 100_000  # (tenant, hour, reporter) keys remembered; then forgotten


class CassandraUsageStore(CassandraBase):
    component = "usage"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._inc = p(
            "UPDATE usage SET "
            + ", ".join(f"{c}={c}+?" for c in USAGE_SUMMED)
            + " WHERE tenant=? AND hour_ms=? AND node_id=?"
        )
        self._raise_peak = p(
            "UPDATE usage_connections SET connections_max=? "
            "WHERE tenant=? AND hour_ms=? AND node_id=? IF connections_max < ?"
        )
        self._first_peak = p(
            "INSERT INTO usage_connections (tenant, hour_ms, node_id, connections_max) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS"
        )
        self._inc_topic = p(
            "UPDATE usage_topics SET messages=messages+? WHERE tenant=? AND hour_ms=? AND topic=?"
        )
        cols = ", ".join(USAGE_SUMMED)
        self._usage = p(f"SELECT tenant, hour_ms, node_id, {cols} FROM usage WHERE tenant=?")
        self._peaks = p(
            "SELECT hour_ms, node_id, connections_max FROM usage_connections WHERE tenant=?"
        )
        self._topic_hours = p("SELECT DISTINCT tenant, hour_ms FROM usage_topics")
        self._topics = p(
            "SELECT tenant, hour_ms, topic, messages FROM usage_topics WHERE tenant=? AND hour_ms=?"
        )
        self._peak_written: dict[tuple[str, int, str], int] = {}

    async def add(self, deltas: Sequence[UsageDelta], topics: Sequence[TopicDelta] = ()) -> None:
        for d in deltas:
            await self._exec(
                self._inc,
                (*(getattr(d, c) for c in USAGE_SUMMED), d.tenant, d.hour_ms, d.node_id),
            )
            if d.connections:
                await self._raise(d)
        for t in topics:
            await self._exec(self._inc_topic, (t.messages, t.tenant, t.hour_ms, t.topic))

    async def _raise(self, d: UsageDelta) -> None:
        """connections_max = max(connections_max, d.connections), compare-and-set."""
        key = (d.tenant, d.hour_ms, d.node_id)
        if self._peak_written.get(key, -1) >= d.connections:
            return
        for _ in range(3):  # an insert and an update racing another writer: settle in 3
            (row,) = await self._exec(self._raise_peak, (d.connections, *key, d.connections))
            if row[0]:  # [applied]
                break
            current = getattr(row, "connections_max", None)
            if current is not None and current >= d.connections:
                break
            if current is None:  # no row yet
                (ins,) = await self._exec(self._first_peak, (*key, d.connections))
                if ins[0]:
                    break
        if len(self._peak_written) >= _MAX_PEAKS_CACHED:
            self._peak_written.clear()
        self._peak_written[key] = d.connections

    async def usage(self, tenant: str) -> list[UsageDelta]:
        peaks = {
            (r.hour_ms, r.node_id): r.connections_max or 0
            for r in await self._exec(self._peaks, (tenant,))
        }
        out = []
        for r in await self._exec(self._usage, (tenant,)):
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
        # DISTINCT over the partition keys: a scan of partition keys only, for tests and
        # tools (analytics reads the table through Spark, not through this).
        hours = sorted(r.hour_ms for r in await self._exec(self._topic_hours) if r.tenant == tenant)
        out: list[TopicDelta] = []
        for h in hours:
            rows = await self._exec(self._topics, (tenant, h))
            out += sorted(
                (TopicDelta(r.tenant, r.hour_ms, r.topic, r.messages or 0) for r in rows),
                key=lambda t: t.topic,
            )
        return out
