"""Embedded `QueueStore`: per-session queues in SQLite, same logical schema as Cassandra.
This module owns the schema and its migrations, the store's connection and group commit, the
partition owners, reads, acks and drops; the append's body is sqlite_queue_append.py, the
compaction job's deletes sqlite_queue_compaction.py.

Invariants:
- `seq` increases by one per appended entry of a queue; entries are never rewritten, only
  marked released (outbound QoS 2) or deleted (ack, drop-oldest, drop).
- An append commits in one transaction that first checks the partition's owner epoch, so an
  instance that lost its partition can no longer write (fencing).
- `delivered_through` (queue_state) only grows: a read for delivery raises it in the same
  transaction that reads the entries, and an append whose entries are pushed to a reader
  (`mark_delivered`) in the transaction that appends them; committed before the entries go
  to a connection.
- Writes are group-committed (services/common/store/group_commit.py): concurrent appends,
  delivery reads, acks and drops of any queues share one transaction and one fsync, and none
  is answered before that transaction committed. Acks alone commit without an fsync (see
  `ack`); the WAL is checkpointed by a background thread, never by a commit.
- A message id appended to a queue is remembered in `queue_msgids` for MSGID_RETENTION_MS,
  even after its entry is acked and deleted: a retried append of the same message (the
  router died before answering, the node retries) is a no-op, not a second delivery.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from services.common import clock
from services.common.store.group_commit import GroupCommit
from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    StoredEntry,
)
from services.common.store.sqlite_base import SqliteDb
from services.common.store.sqlite_queue_append import (
    AppendBatch,
    append_batch,
    mark_appended_delivered,
)

MSGID_RETENTION_MS = 15 * 60 * 1000  # far longer than any retry of an append
PRUNE_EVERY = 1000  # appends between prunes of old message ids

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue_entries (
  tenant TEXT NOT NULL, queue_id TEXT NOT NULL, bucket INTEGER NOT NULL, seq INTEGER NOT NULL,
  message_id TEXT NOT NULL, qos INTEGER NOT NULL, data BLOB NOT NULL,
  expires_at_ms INTEGER NOT NULL, released INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, queue_id, seq));
CREATE TABLE IF NOT EXISTS queue_msgids (
  tenant TEXT NOT NULL, queue_id TEXT NOT NULL, message_id TEXT NOT NULL, seq INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL, PRIMARY KEY (tenant, queue_id, message_id));
CREATE INDEX IF NOT EXISTS queue_msgids_age ON queue_msgids (created_at_ms);
CREATE TABLE IF NOT EXISTS queue_state (
  tenant TEXT NOT NULL, queue_id TEXT NOT NULL, last_seq INTEGER NOT NULL,
  acked_through INTEGER NOT NULL, depth INTEGER NOT NULL, dropped INTEGER NOT NULL,
  delivered_through INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, queue_id));
CREATE TABLE IF NOT EXISTS partition_owner (
  partition INTEGER PRIMARY KEY, epoch INTEGER NOT NULL);
"""


def _add_delivered_through(db: sqlite3.Connection) -> None:
    """Migrate a database made before queue_state had delivered_through. Nothing recorded
    what was sent, so every entry already queued counts as possibly sent (DUP=1, as before)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(queue_state)")}
    if "delivered_through" not in columns:
        db.execute(
            "ALTER TABLE queue_state ADD COLUMN delivered_through INTEGER NOT NULL DEFAULT 0"
        )
        db.execute("UPDATE queue_state SET delivered_through=last_seq")


def _add_bytes(db: sqlite3.Connection) -> None:
    """Migrate a database made before queue_state had bytes: each queue's entries above its
    acked_through, summed once."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(queue_state)")}
    if "bytes" not in columns:
        db.execute("ALTER TABLE queue_state ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0")
        db.execute(
            "UPDATE queue_state SET bytes=(SELECT coalesce(sum(length(e.data)), 0) FROM "
            "queue_entries e WHERE e.tenant=queue_state.tenant AND "
            "e.queue_id=queue_state.queue_id AND e.seq>queue_state.acked_through)"
        )


def _state(db: sqlite3.Connection, tenant: str, queue_id: str) -> QueueState:
    row = db.execute(
        "SELECT last_seq, acked_through, depth, dropped, delivered_through, bytes "
        "FROM queue_state "
        "WHERE tenant=? AND queue_id=?",
        (tenant, queue_id),
    ).fetchone()
    return QueueState(*row) if row else QueueState(0, 0, 0, 0)


def _owns_partition(db: sqlite3.Connection, partition: int, epoch: int) -> bool:
    """Whether `epoch` is still the partition's owner epoch (else this instance is fenced)."""
    row = db.execute("SELECT epoch FROM partition_owner WHERE partition=?", (partition,)).fetchone()
    return row is not None and row[0] == epoch


class SqliteQueueStore(SqliteDb):
    """The queues file (`queues.db`): one worker thread, writes group-committed."""

    def __init__(self, path: Path, sync: str = "full") -> None:
        super().__init__(path, _SCHEMA, sync, background_checkpoint=True)
        # In a transaction: another process opening the same file migrates it only once.
        self.tx(_add_delivered_through)
        self.tx(_add_bytes)
        self._appends = 0
        self.group = GroupCommit(self.db, self._pool, fsync=sync == "full")

    async def claim_partition(self, partition: int) -> int:
        def claim(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT epoch FROM partition_owner WHERE partition=?", (partition,)
            ).fetchone()
            epoch = (row[0] if row else 0) + 1
            db.execute("INSERT OR REPLACE INTO partition_owner VALUES (?, ?)", (partition, epoch))
            return int(epoch)

        return await self.run(lambda: self.tx(claim))

    async def append(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        mark_delivered: bool = False,
        room_bytes: int | None = None,
    ) -> AppendReport:
        batch = AppendBatch(
            tenant=tenant,
            queue_id=queue_id,
            items=items,
            max_depth=max_depth,
            drop_oldest=drop_oldest,
            room_bytes=room_bytes,
        )

        def append(db: sqlite3.Connection) -> AppendReport:
            # Checked in the same transaction as the writes: a fenced instance writes nothing.
            if not _owns_partition(db, partition, epoch):
                return AppendReport([AppendOutcome.FENCED] * len(items))
            before = _state(db, tenant, queue_id)
            now_ms = clock.now_ms()
            self._prune_msgids_now_and_then(db, now_ms)
            report = append_batch(db, batch, before, now_ms)
            if mark_delivered and AppendOutcome.OK in report.outcomes:
                mark_appended_delivered(db, tenant, queue_id, report.last_seq)
            return report

        return await self.group.run(append)

    def _prune_msgids_now_and_then(self, db: sqlite3.Connection, now_ms: int) -> None:
        """Every PRUNE_EVERY appends, forget message ids older than MSGID_RETENTION_MS: often
        enough to bound the table, rarely enough not to cost on every append."""
        self._appends += 1
        if self._appends % PRUNE_EVERY == 0:
            db.execute(
                "DELETE FROM queue_msgids WHERE created_at_ms < ?",
                (now_ms - MSGID_RETENTION_MS,),
            )

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        def read(db: sqlite3.Connection) -> tuple[list[StoredEntry], QueueState]:
            cur = db.execute(
                "SELECT seq, qos, data, expires_at_ms, released FROM queue_entries WHERE "
                "tenant=? AND queue_id=? AND seq>=? ORDER BY seq LIMIT ?",
                (tenant, queue_id, from_seq, limit),
            )
            entries: list[StoredEntry] = []
            total = 0
            # Row by row: past the byte cap nothing more is loaded into memory.
            for s, q, d, e, r in cur:
                total += len(d)
                if entries and max_bytes and total > max_bytes:
                    break
                entries.append(StoredEntry(s, q, d, e, bool(r)))
            cur.close()
            st = _state(db, tenant, queue_id)
            if mark_delivered and entries and entries[-1].seq > st.delivered_through:
                db.execute(
                    "UPDATE queue_state SET delivered_through=? WHERE tenant=? AND queue_id=?",
                    (entries[-1].seq, tenant, queue_id),
                )
            return entries, st

        if mark_delivered:  # committed (synchronous=FULL) before the caller sends anything
            return await self.group.run(read)
        return await self.run(lambda: read(self.db))

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        def ack(db: sqlite3.Connection) -> QueueChange:
            st = _state(db, tenant, queue_id)
            if through_seq <= st.acked_through:
                return QueueChange()
            # length() of a blob reads its size from the record header, not its content.
            freed = db.execute(
                "SELECT coalesce(sum(length(data)), 0) FROM queue_entries "
                "WHERE tenant=? AND queue_id=? AND seq<=?",
                (tenant, queue_id, through_seq),
            ).fetchone()[0]
            cur = db.execute(
                "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND seq<=?",
                (tenant, queue_id, through_seq),
            )
            depth = max(0, st.depth - cur.rowcount)
            held = max(0, st.bytes - int(freed))
            db.execute(
                "UPDATE queue_state SET acked_through=?, depth=?, bytes=? "
                "WHERE tenant=? AND queue_id=?",
                (min(through_seq, st.last_seq), depth, held, tenant, queue_id),
            )
            return QueueChange(depth - st.depth, held - st.bytes)

        # Lost on a power cut, an ack only makes its entries go out again (DUP=1, read back
        # past delivered_through), which QoS 1 and 2 allow: no fsync of its own.
        return await self.group.run(ack, durable=False)

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        def mark(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE queue_entries SET released=1 WHERE tenant=? AND queue_id=? AND seq=?",
                (tenant, queue_id, seq),
            )

        await self.group.run(mark)

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        def drop(db: sqlite3.Connection) -> QueueChange:
            st = _state(db, tenant, queue_id)
            db.execute(
                "DELETE FROM queue_entries WHERE tenant=? AND queue_id=?", (tenant, queue_id)
            )
            db.execute("DELETE FROM queue_state WHERE tenant=? AND queue_id=?", (tenant, queue_id))
            db.execute("DELETE FROM queue_msgids WHERE tenant=? AND queue_id=?", (tenant, queue_id))
            return QueueChange(-st.depth, -st.bytes)

        return await self.group.run(drop)

    async def state(self, tenant: str, queue_id: str) -> QueueState:
        return await self.run(lambda: _state(self.db, tenant, queue_id))

    async def depths(self) -> list[tuple[str, str, int, int]]:
        def depths() -> list[tuple[str, str, int, int]]:
            rows = self.db.execute(
                "SELECT tenant, queue_id, depth, bytes FROM queue_state WHERE depth>0 OR bytes>0"
            ).fetchall()
            return [(str(t), str(q), int(d), int(b)) for t, q, d, b in rows]

        return await self.run(depths)
