"""The event log and the routing snapshots in the embedded store (`EventLog` on SQLite), kept
in the sessions file so a subscription change and its log row commit in one transaction.

Positions are assigned inside the writing transaction from `log_head` (one row): SQLite has
one writer at a time, so positions grow in commit order and every position at or below the
head is committed: the head is the stable position.

Pruning drops exactly the route events at or below the snapshot's checkpoint (the other
kinds, records for reports, by whole hours as before) and, in the same transaction, raises
each tenant's watermark in `log_pruned` to the last route event of it dropped
(`pruned_through`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from services.common.clock import now_ms
from services.common.store.eventlog import (
    ROUTE_KINDS,
    LogEvent,
    SnapshotManifest,
    bucket_of,
    next_position,
)
from services.common.store.sqlite_base import SqliteDb

SCHEMA = """
CREATE TABLE IF NOT EXISTS event_log (
  tenant TEXT NOT NULL, bucket INTEGER NOT NULL, position INTEGER NOT NULL,
  kind TEXT NOT NULL, client_id TEXT NOT NULL, incarnation INTEGER NOT NULL,
  topic TEXT NOT NULL, options INTEGER NOT NULL, data BLOB NOT NULL,
  PRIMARY KEY (tenant, bucket, position));
CREATE INDEX IF NOT EXISTS event_log_position ON event_log (position);
CREATE TABLE IF NOT EXISTS log_head (
  id INTEGER PRIMARY KEY CHECK (id = 0), position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log_pruned (tenant TEXT PRIMARY KEY, position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS route_snapshots (
  snapshot_id INTEGER PRIMARY KEY, checkpoint INTEGER NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS route_snapshot_tenants (
  snapshot_id INTEGER NOT NULL, tenant TEXT NOT NULL, subscriptions INTEGER NOT NULL,
  parts INTEGER NOT NULL, PRIMARY KEY (snapshot_id, tenant));
CREATE TABLE IF NOT EXISTS route_snapshot_parts (
  snapshot_id INTEGER NOT NULL, tenant TEXT NOT NULL, part INTEGER NOT NULL,
  data BLOB NOT NULL, PRIMARY KEY (snapshot_id, tenant, part));
"""

_COLS = "tenant, bucket, position, kind, client_id, incarnation, topic, options, data"
KEEP_SNAPSHOTS = 2  # the one in force and the one before it (a reader may be loading it)


def _event(row: tuple[object, ...]) -> LogEvent:
    tenant, _bucket, position, kind, client_id, incarnation, topic, options, data = row
    return LogEvent(
        str(tenant),
        str(kind),
        str(client_id),
        int(incarnation),  # type: ignore[call-overload]
        str(topic),
        int(options),  # type: ignore[call-overload]
        bytes(data),  # type: ignore[call-overload]
        int(position),  # type: ignore[call-overload]
    )


def log_in_tx(db: sqlite3.Connection, events: Iterable[LogEvent]) -> int:
    """Append `events` inside the caller's write transaction; the last position (0: none)."""
    row = db.execute("SELECT position FROM log_head WHERE id = 0").fetchone()
    last = first = int(row[0]) if row else 0
    now = now_ms()
    rows = []
    for e in events:
        last = next_position(last, now)
        rows.append(
            (
                e.tenant,
                bucket_of(last),
                last,
                e.kind,
                e.client_id,
                e.incarnation,
                e.topic,
                e.options,
                e.data,
            )
        )
    if last == first:
        return 0
    db.executemany(f"INSERT INTO event_log ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?)", rows)
    db.execute("INSERT OR REPLACE INTO log_head (id, position) VALUES (0, ?)", (last,))
    return last


class SqliteEventLog(SqliteDb):
    """`EventLog` on the store's connection (a mixin of the sessions store)."""

    async def append_events(self, events: list[LogEvent]) -> int:
        if not events:
            return 0
        return await self.run(lambda: self.tx(lambda db: log_in_tx(db, events)))

    async def read_events(
        self,
        after: int,
        limit: int,
        tenant: str | None = None,
        kinds: frozenset[str] = ROUTE_KINDS,
    ) -> list[LogEvent]:
        marks = ",".join("?" * len(kinds))
        if tenant is None:
            sql = f"SELECT {_COLS} FROM event_log WHERE position > ? AND kind IN ({marks}) "
            args: tuple[object, ...] = (after, *kinds)
        else:
            # The tenant's partitions from the bucket of `after` on: the primary key serves it.
            sql = (
                f"SELECT {_COLS} FROM event_log WHERE tenant = ? AND bucket >= ? "
                f"AND position > ? AND kind IN ({marks}) "
            )
            args = (tenant, bucket_of(after), after, *kinds)
        rows = await self.run(
            lambda: self.db.execute(sql + "ORDER BY position LIMIT ?", (*args, limit)).fetchall()
        )
        return [_event(r) for r in rows]

    async def stable_position(self) -> int:
        row = await self.run(
            lambda: self.db.execute("SELECT position FROM log_head WHERE id = 0").fetchone()
        )
        return int(row[0]) if row else 0

    async def prune_events(self, before: int) -> int:
        marks = ",".join("?" * len(ROUTE_KINDS))

        def prune(db: sqlite3.Connection) -> int:
            db.execute(
                "INSERT INTO log_pruned (tenant, position) SELECT tenant, max(position) "
                f"FROM event_log WHERE position <= ? AND kind IN ({marks}) GROUP BY tenant "
                "ON CONFLICT (tenant) DO UPDATE SET position = "
                "max(log_pruned.position, excluded.position)",
                (before, *ROUTE_KINDS),
            )
            # Other kinds (records for reports) by whole hours, as Cassandra drops them.
            cur = db.execute(
                f"DELETE FROM event_log WHERE position <= ? AND (kind IN ({marks}) OR bucket < ?)",
                (before, *ROUTE_KINDS, bucket_of(before + 1)),
            )
            return int(cur.rowcount)

        return await self.run(lambda: self.tx(prune))

    async def pruned_through(self, tenant: str | None = None) -> int:
        sql = "SELECT max(position) FROM log_pruned"
        args: tuple[str, ...] = ()
        if tenant is not None:
            sql, args = sql + " WHERE tenant = ?", (tenant,)
        row = await self.run(lambda: self.db.execute(sql, args).fetchone())
        return int(row[0]) if row and row[0] is not None else 0

    async def put_snapshot(
        self, checkpoint: int, parts: dict[str, tuple[int, list[bytes]]]
    ) -> SnapshotManifest:
        created = now_ms()

        def write(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT max(snapshot_id) FROM route_snapshots").fetchone()
            sid = max(int(row[0] or 0) + 1, created)
            # Parts and the tenant list first, the manifest row last; one transaction here,
            # so a crashed writer leaves nothing at all and the previous snapshot in force.
            for tenant, (count, blobs) in parts.items():
                db.execute(
                    "INSERT INTO route_snapshot_tenants VALUES (?,?,?,?)",
                    (sid, tenant, count, len(blobs)),
                )
                db.executemany(
                    "INSERT INTO route_snapshot_parts VALUES (?,?,?,?)",
                    [(sid, tenant, i, b) for i, b in enumerate(blobs)],
                )
            db.execute("INSERT INTO route_snapshots VALUES (?,?,?)", (sid, checkpoint, created))
            old = [
                r[0]
                for r in db.execute(
                    "SELECT snapshot_id FROM route_snapshots ORDER BY snapshot_id DESC "
                    "LIMIT -1 OFFSET ?",
                    (KEEP_SNAPSHOTS,),
                )
            ]
            for o in old:
                for table in ("route_snapshots", "route_snapshot_tenants", "route_snapshot_parts"):
                    db.execute(f"DELETE FROM {table} WHERE snapshot_id = ?", (o,))
            return sid

        sid = await self.run(lambda: self.tx(write))
        tenants = {t: (n, len(b)) for t, (n, b) in parts.items()}
        return SnapshotManifest(sid, checkpoint, created, tenants)

    async def latest_snapshot(self) -> SnapshotManifest | None:
        def read() -> SnapshotManifest | None:
            self.db.execute("BEGIN")
            try:
                row = self.db.execute(
                    "SELECT snapshot_id, checkpoint, created_ms FROM route_snapshots "
                    "ORDER BY snapshot_id DESC LIMIT 1"
                ).fetchone()
                if row is None:
                    return None
                tenants = {
                    str(t): (int(n), int(p))
                    for t, n, p in self.db.execute(
                        "SELECT tenant, subscriptions, parts FROM route_snapshot_tenants "
                        "WHERE snapshot_id = ?",
                        (row[0],),
                    )
                }
                return SnapshotManifest(int(row[0]), int(row[1]), int(row[2]), tenants)
            finally:
                self.db.execute("COMMIT")

        return await self.run(read)

    async def snapshot_parts(self, snapshot_id: int, tenant: str) -> list[bytes]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT data FROM route_snapshot_parts WHERE snapshot_id = ? AND tenant = ? "
                "ORDER BY part",
                (snapshot_id, tenant),
            ).fetchall()
        )
        return [bytes(r[0]) for r in rows]
