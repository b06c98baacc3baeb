"""Embedded usage table: per tenant, hour and node, the traffic the metrics service
aggregated from the nodes' stats reports (the tenant report's input, analytics/jobs/
tenant_report.py). Rows only grow by deltas; one transaction per report."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
  tenant TEXT NOT NULL, hour_ms INTEGER NOT NULL, node_id TEXT NOT NULL,
  connections_max INTEGER NOT NULL, connection_ms INTEGER NOT NULL,
  messages_in INTEGER NOT NULL, messages_out INTEGER NOT NULL, dropped INTEGER NOT NULL,
  PRIMARY KEY (tenant, hour_ms, node_id));
"""


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one node added for one tenant in one hour since its previous report."""

    tenant: str
    hour_ms: int  # start of the hour, epoch ms
    node_id: str
    connections: int  # open at the report
    connection_ms: int
    messages_in: int
    messages_out: int
    dropped: int


class SqliteUsageStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)

    async def add(self, deltas: Sequence[UsageDelta]) -> None:
        def add(db: sqlite3.Connection) -> None:
            db.executemany(
                "INSERT INTO usage VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (tenant, hour_ms, "
                "node_id) DO UPDATE SET connections_max=max(connections_max, "
                "excluded.connections_max), connection_ms=connection_ms+excluded.connection_ms, "
                "messages_in=messages_in+excluded.messages_in, "
                "messages_out=messages_out+excluded.messages_out, "
                "dropped=dropped+excluded.dropped",
                [
                    (d.tenant, d.hour_ms, d.node_id, d.connections, d.connection_ms,
                     d.messages_in, d.messages_out, d.dropped)
                    for d in deltas
                ],
            )  # fmt: skip

        if deltas:
            await self.run(lambda: self.tx(add))
