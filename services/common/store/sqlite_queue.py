"""Embedded `QueueStore`: per-session queues in SQLite, same logical schema as Cassandra.

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
import time
from pathlib import Path

from services.common.store.group_commit import GroupCommit
from services.common.store.ports import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    StoredEntry,
    entry_row,
)
from services.common.store.sqlite_base import SqliteDb

MSGID_RETENTION_MS = 15 * 60 * 1000  # far longer than any retry of an append
PRUNE_EVERY = 1000  # appends between prunes of old message ids
# Message ids per duplicate-check query (SQLite allows 32,766 parameters; old builds 999).
KNOWN_CHUNK = 500

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


def _is_known_message(db: sqlite3.Connection, tenant: str, queue_id: str, message_id: str) -> bool:
    """Whether the message was appended to the queue already (a retried append)."""
    return bool(
        db.execute(
            "SELECT 1 FROM queue_msgids WHERE tenant=? AND queue_id=? AND message_id=?",
            (tenant, queue_id, message_id),
        ).fetchone()
    )


def _known_messages(
    db: sqlite3.Connection, tenant: str, queue_id: str, message_ids: list[str]
) -> set[str]:
    """Which of `message_ids` were appended to the queue already: one query per
    KNOWN_CHUNK ids instead of one per id."""
    known: set[str] = set()
    for i in range(0, len(message_ids), KNOWN_CHUNK):
        chunk = message_ids[i : i + KNOWN_CHUNK]
        marks = ",".join("?" * len(chunk))
        known.update(
            row[0]
            for row in db.execute(
                "SELECT message_id FROM queue_msgids WHERE tenant=? AND queue_id=? "
                f"AND message_id IN ({marks})",
                (tenant, queue_id, *chunk),
            )
        )
    return known


def _delete_oldest_entry(db: sqlite3.Connection, tenant: str, queue_id: str) -> int | None:
    """Delete the queue's oldest entry, to make room (drop_oldest); its data's length, None
    if it has none."""
    row = db.execute(
        "SELECT seq, length(data) FROM queue_entries WHERE tenant=? AND queue_id=? "
        "ORDER BY seq LIMIT 1",
        (tenant, queue_id),
    ).fetchone()
    if row is None:
        return None
    db.execute(
        "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND seq=?",
        (tenant, queue_id, row[0]),
    )
    return int(row[1])


def _insert_entry(
    db: sqlite3.Connection, tenant: str, queue_id: str, seq: int, item: NewQueueItem, now_ms: int
) -> None:
    """Store the entry at `seq`, and remember its message id for retried appends."""
    db.execute(
        "INSERT INTO queue_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
        entry_row(tenant, queue_id, seq, item),
    )
    db.execute(
        "INSERT INTO queue_msgids VALUES (?, ?, ?, ?, ?)",
        (tenant, queue_id, item.message_id, seq, now_ms),
    )


def _append_all(
    db: sqlite3.Connection,
    tenant: str,
    queue_id: str,
    items: list[NewQueueItem],
    last: int,
    now_ms: int,
) -> tuple[list[str], int]:
    """Store every entry whose message id the queue has not seen (a repeat within `items`
    included), in order from seq `last` + 1; the outcomes and the new last seq."""
    known = _known_messages(db, tenant, queue_id, [it.message_id for it in items])
    out: list[str] = []
    rows = []
    for item in items:
        if item.message_id in known:
            out.append(AppendOutcome.DUPLICATE)
            continue
        known.add(item.message_id)
        last += 1
        rows.append(entry_row(tenant, queue_id, last, item))
        out.append(AppendOutcome.OK)
    if rows:
        db.executemany("INSERT INTO queue_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)", rows)
        db.executemany(
            "INSERT INTO queue_msgids VALUES (?, ?, ?, ?, ?)",
            [(tenant, queue_id, r[4], r[3], now_ms) for r in rows],
        )
    return out, last


class SqliteQueueStore(SqliteDb):
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
        def append(db: sqlite3.Connection) -> AppendReport:
            report = self._append_tx(
                db, tenant, queue_id, items, partition, epoch, max_depth, drop_oldest, room_bytes
            )
            if mark_delivered and AppendOutcome.OK in report.outcomes:
                db.execute(
                    "UPDATE queue_state SET delivered_through=? WHERE tenant=? AND queue_id=? "
                    "AND delivered_through<?",
                    (report.last_seq, tenant, queue_id, report.last_seq),
                )
            return report

        return await self.group.run(append)

    def _append_tx(
        self,
        db: sqlite3.Connection,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        room_bytes: int | None,
    ) -> AppendReport:
        """The body of `append`, inside its transaction."""
        # Checked in the same transaction as the writes: a fenced instance writes nothing.
        if not _owns_partition(db, partition, epoch):
            return AppendReport([AppendOutcome.FENCED] * len(items))
        st = _state(db, tenant, queue_id)
        last, depth, dropped, held = st.last_seq, st.depth, st.dropped, st.bytes
        now_ms = int(time.time() * 1000)
        self._prune_msgids_now_and_then(db, now_ms)
        fits_depth = not max_depth or depth + len(items) <= max_depth
        if fits_depth and (room_bytes is None or sum(len(i.data) for i in items) <= room_bytes):
            # No entry to refuse or drop: the batch in a few statements, not three per entry.
            out, last = _append_all(db, tenant, queue_id, items, last, now_ms)
            ok = [it for it, o in zip(items, out, strict=True) if o == AppendOutcome.OK]
            depth += len(ok)
            held += sum(len(it.data) for it in ok)
        else:
            out, last, depth, dropped, held = self._append_one_by_one(
                db,
                tenant,
                queue_id,
                items,
                last,
                depth,
                dropped,
                held,
                max_depth,
                drop_oldest,
                now_ms,
                room_bytes,
            )
        # An upsert, not a replace: the row's delivered_through stays as it is.
        db.execute(
            "INSERT INTO queue_state (tenant, queue_id, last_seq, acked_through, depth, dropped, "
            "bytes) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, queue_id) DO UPDATE SET "
            "last_seq=excluded.last_seq, depth=excluded.depth, dropped=excluded.dropped, "
            "bytes=excluded.bytes",
            (tenant, queue_id, last, st.acked_through, depth, dropped, held),
        )
        return AppendReport(out, last, dropped - st.dropped, depth - st.depth, held - st.bytes)

    @staticmethod
    def _append_one_by_one(
        db: sqlite3.Connection,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        last: int,
        depth: int,
        dropped: int,
        held: int,
        max_depth: int,
        drop_oldest: bool,
        now_ms: int,
        room_bytes: int | None,
    ) -> tuple[list[str], int, int, int, int]:
        """The append at the depth limit or near the tenant's queued bytes: each entry
        refused, or stored (after the oldest one is dropped, at the depth limit), in turn.
        `room_bytes`: how many bytes this append may add (None: no limit)."""
        out = []
        start = held
        for item in items:
            if _is_known_message(db, tenant, queue_id, item.message_id):
                out.append(AppendOutcome.DUPLICATE)
                continue
            if room_bytes is not None and held - start + len(item.data) > room_bytes:
                out.append(AppendOutcome.OVER_BYTES)
                continue
            if max_depth and depth >= max_depth:
                if not drop_oldest:
                    dropped += 1
                    out.append(AppendOutcome.FULL)
                    continue
                freed = _delete_oldest_entry(db, tenant, queue_id)
                if freed is not None:
                    depth -= 1
                    dropped += 1
                    held -= freed
            last += 1
            _insert_entry(db, tenant, queue_id, last, item, now_ms)
            depth += 1
            held += len(item.data)
            out.append(AppendOutcome.OK)
        return out, last, depth, dropped, held

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


# ---- Compaction (analytics/jobs/queue_compaction.py) ---------------------------------------
# Conditional deletes: the compaction job proposes keys it found from a snapshot of the
# tables; each delete re-checks its condition inside the write transaction, so a row that is
# live by the time of the delete stays. Every condition only ever goes from false to true
# (acked_through grows, an entry's expiry is fixed, an expired session cannot be resumed, an
# incarnation never comes back), so a row that passes the re-check can never be needed again.


def compact_acked(db: sqlite3.Connection, tenant: str, queue_id: str, through_seq: int) -> int:
    """Delete the queue's entries up to `through_seq` that are acknowledged (seq <=
    acked_through, read now). Depth is untouched: the ack counted them out already."""
    return db.execute(
        "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND seq<=? AND seq<=("
        "SELECT acked_through FROM queue_state WHERE tenant=? AND queue_id=?)",
        (tenant, queue_id, through_seq, tenant, queue_id),
    ).rowcount


def compact_expired(
    db: sqlite3.Connection, tenant: str, queue_id: str, lo_seq: int, hi_seq: int, now_ms: int
) -> int:
    """Delete the queue's entries with lo_seq <= seq <= hi_seq whose expiry has passed
    (expires_at_ms 0 never expires) and lower the queue's depth and bytes by as many."""
    where = (
        "WHERE tenant=? AND queue_id=? AND seq BETWEEN ? AND ? "
        "AND expires_at_ms>0 AND expires_at_ms<?"
    )
    args = (tenant, queue_id, lo_seq, hi_seq, now_ms)
    freed = db.execute(
        f"SELECT coalesce(sum(length(data)), 0) FROM queue_entries {where}", args
    ).fetchone()[0]
    n = db.execute(f"DELETE FROM queue_entries {where}", args).rowcount
    if n:
        # The next ack counts only the rows it deletes, so depth and bytes stay equal to the
        # rows left.
        db.execute(
            "UPDATE queue_state SET depth=max(0, depth-?), bytes=max(0, bytes-?) "
            "WHERE tenant=? AND queue_id=?",
            (n, int(freed), tenant, queue_id),
        )
    return n


def compact_session_queue(
    db: sqlite3.Connection,
    sessions_schema: str,
    tenant: str,
    client_id: str,
    incarnation: int,
    now_ms: int,
) -> int:
    """Drop the whole queue of a session incarnation that is over: its session record (in the
    attached database `sessions_schema`) has expired, or belongs to a later incarnation.
    Returns the entries removed, -1 when the re-check kept the queue."""
    over = db.execute(
        f"SELECT 1 FROM {sessions_schema}.sessions WHERE tenant=? AND client_id=? AND "
        "((expires_at_ms IS NOT NULL AND expires_at_ms<=?) OR incarnation>?)",
        (tenant, client_id, now_ms, incarnation),
    ).fetchone()
    if over is None:
        return -1
    qid = f"{client_id}#{incarnation}"
    n = db.execute(
        "DELETE FROM queue_entries WHERE tenant=? AND queue_id=?", (tenant, qid)
    ).rowcount
    db.execute("DELETE FROM queue_state WHERE tenant=? AND queue_id=?", (tenant, qid))
    db.execute("DELETE FROM queue_msgids WHERE tenant=? AND queue_id=?", (tenant, qid))
    return n


def compact_msgids(db: sqlite3.Connection, keys: list[tuple[str, str, str]], before_ms: int) -> int:
    """Forget (tenant, queue_id, message_id) de-duplication records created before
    `before_ms` (the end of the de-duplication window, MSGID_RETENTION_MS)."""
    n = 0
    for tenant, qid, mid in keys:
        n += db.execute(
            "DELETE FROM queue_msgids WHERE tenant=? AND queue_id=? AND message_id=? "
            "AND created_at_ms<?",
            (tenant, qid, mid, before_ms),
        ).rowcount
    return n
