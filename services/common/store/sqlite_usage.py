"""Embedded usage tables: per tenant, hour and reporter, the traffic the metrics service
aggregated from the stats reports (`usage`), and per tenant, hour and topic the messages of
the busiest topics (`usage_topics`); the tenant report's input (analytics/jobs/
tenant_report.py). Rows only grow by deltas; one transaction per report.

A file written by an older version lacks the per-QoS, byte and refusal columns: they are
added (at 0) when the store opens.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from services.common.store.ports_usage import USAGE_SUMMED, TopicDelta, UsageDelta
from services.common.store.sqlite_base import SqliteDb

_NEW_COLUMNS = USAGE_SUMMED[4:]  # after connection_ms, messages_in/out, dropped
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage (
  tenant TEXT NOT NULL, hour_ms INTEGER NOT NULL, node_id TEXT NOT NULL,
  connections_max INTEGER NOT NULL, connection_ms INTEGER NOT NULL,
  messages_in INTEGER NOT NULL, messages_out INTEGER NOT NULL, dropped INTEGER NOT NULL,
  {", ".join(f"{c} INTEGER NOT NULL DEFAULT 0" for c in _NEW_COLUMNS)},
  PRIMARY KEY (tenant, hour_ms, node_id));
CREATE TABLE IF NOT EXISTS usage_topics (
  tenant TEXT NOT NULL, hour_ms INTEGER NOT NULL, topic TEXT NOT NULL,
  messages INTEGER NOT NULL,
  PRIMARY KEY (tenant, hour_ms, topic));
"""
_COLUMNS = ("tenant", "hour_ms", "node_id", "connections_max", *USAGE_SUMMED)
_UPSERT = (
    f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
    "ON CONFLICT (tenant, hour_ms, node_id) DO UPDATE SET "
    "connections_max=max(connections_max, excluded.connections_max), "
    + ", ".join(f"{c}={c}+excluded.{c}" for c in USAGE_SUMMED)
)
_UPSERT_TOPIC = (
    "INSERT INTO usage_topics VALUES (?,?,?,?) ON CONFLICT (tenant, hour_ms, topic) "
    "DO UPDATE SET messages=messages+excluded.messages"
)


def _add_missing_columns(db: sqlite3.Connection) -> None:
    have = {row[1] for row in db.execute("PRAGMA table_info(usage)")}
    for c in _NEW_COLUMNS:
        if c not in have:
            db.execute(f"ALTER TABLE usage ADD COLUMN {c} INTEGER NOT NULL DEFAULT 0")


class SqliteUsageStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)
        self.tx(_add_missing_columns)

    async def add(self, deltas: Sequence[UsageDelta], topics: Sequence[TopicDelta] = ()) -> None:
        def add(db: sqlite3.Connection) -> None:
            db.executemany(
                _UPSERT,
                [
                    (d.tenant, d.hour_ms, d.node_id, d.connections,
                     *(getattr(d, c) for c in USAGE_SUMMED))
                    for d in deltas
                ],
            )  # fmt: skip
            db.executemany(
                _UPSERT_TOPIC, [(t.tenant, t.hour_ms, t.topic, t.messages) for t in topics]
            )

        if deltas or topics:
            await self.run(lambda: self.tx(add))

    async def usage(self, tenant: str) -> list[UsageDelta]:
        def read() -> list[UsageDelta]:
            rows = self.db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM usage WHERE tenant=? ORDER BY hour_ms, node_id",
                (tenant,),
            ).fetchall()
            return [UsageDelta(*r) for r in rows]

        return await self.run(read)

    async def topics(self, tenant: str) -> list[TopicDelta]:
        def read() -> list[TopicDelta]:
            rows = self.db.execute(
                "SELECT tenant, hour_ms, topic, messages FROM usage_topics WHERE tenant=? "
                "ORDER BY hour_ms, topic",
                (tenant,),
            ).fetchall()
            return [TopicDelta(*r) for r in rows]

        return await self.run(read)
