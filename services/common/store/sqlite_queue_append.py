"""The embedded queue store's append, inside its transaction (sqlite_queue.py opens it, after
checking the partition's owner epoch): duplicates skipped, the depth limit and the tenant's
queued bytes applied, the entries and their message ids stored, the queue's counters written.

A batch with no entry to refuse or drop is written in a few statements; one at the depth limit
or near the byte cap goes entry by entry, each refused or stored (after the oldest entry is
dropped, with drop-oldest) in turn. Either way `seq` grows by one per stored entry.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, replace

from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueState,
    entry_row,
)

# Message ids per duplicate-check query (SQLite allows 32,766 parameters; old builds 999).
KNOWN_CHUNK = 500

_INSERT_ENTRY = "INSERT INTO queue_entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)"
_INSERT_MSGID = "INSERT INTO queue_msgids VALUES (?, ?, ?, ?, ?)"


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """One call of `SqliteQueueStore.append`: the entries for one queue and the limits they
    meet. `room_bytes`: how many bytes this append may add (None: no limit)."""

    tenant: str
    queue_id: str
    items: list[NewQueueItem]
    max_depth: int
    drop_oldest: bool
    room_bytes: int | None


def append_batch(
    db: sqlite3.Connection, batch: AppendBatch, before: QueueState, now_ms: int
) -> AppendReport:
    """Append `batch` to a queue whose state is `before`, write the new counters, and report
    what changed. The caller holds the transaction and has checked the owner epoch."""
    room = batch.room_bytes
    fits_depth = not batch.max_depth or before.depth + len(batch.items) <= batch.max_depth
    if fits_depth and (room is None or sum(len(i.data) for i in batch.items) <= room):
        # No entry to refuse or drop: the batch in a few statements, not three per entry.
        out, after = _append_all(db, batch, before, now_ms)
    else:
        out, after = _append_one_by_one(db, batch, before, now_ms)
    _write_counters(db, batch, after)
    return AppendReport(
        outcomes=out,
        last_seq=after.last_seq,
        dropped=after.dropped - before.dropped,
        depth_change=after.depth - before.depth,
        bytes_change=after.bytes - before.bytes,
    )


def mark_appended_delivered(
    db: sqlite3.Connection, tenant: str, queue_id: str, last_seq: int
) -> None:
    """Raise the queue's delivered_through to `last_seq` (the appended entries go straight to
    a reader); it never goes down."""
    db.execute(
        "UPDATE queue_state SET delivered_through=? WHERE tenant=? AND queue_id=? "
        "AND delivered_through<?",
        (last_seq, tenant, queue_id, last_seq),
    )


def _write_counters(db: sqlite3.Connection, batch: AppendBatch, after: QueueState) -> None:
    """Store the queue's last seq, depth, dropped count and bytes after the append."""
    # An upsert, not a replace: the row's delivered_through stays as it is.
    db.execute(
        "INSERT INTO queue_state (tenant, queue_id, last_seq, acked_through, depth, dropped, "
        "bytes) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, queue_id) DO UPDATE SET "
        "last_seq=excluded.last_seq, depth=excluded.depth, dropped=excluded.dropped, "
        "bytes=excluded.bytes",
        (
            batch.tenant,
            batch.queue_id,
            after.last_seq,
            after.acked_through,
            after.depth,
            after.dropped,
            after.bytes,
        ),
    )


def _append_all(
    db: sqlite3.Connection, batch: AppendBatch, before: QueueState, now_ms: int
) -> tuple[list[str], QueueState]:
    """Store every entry whose message id the queue has not seen (a repeat within the batch
    included), in order after `before.last_seq`, in a few statements; the outcomes and the
    queue's counters after."""
    tenant, queue_id = batch.tenant, batch.queue_id
    known = _known_messages(db, tenant, queue_id, [it.message_id for it in batch.items])
    out: list[str] = []
    rows = []
    last = before.last_seq
    for item in batch.items:
        if item.message_id in known:
            out.append(AppendOutcome.DUPLICATE)
            continue
        known.add(item.message_id)
        last += 1
        rows.append(entry_row(tenant, queue_id, last, item))
        out.append(AppendOutcome.OK)
    if rows:
        db.executemany(_INSERT_ENTRY, rows)
        db.executemany(_INSERT_MSGID, [(tenant, queue_id, r[4], r[3], now_ms) for r in rows])
    after = replace(
        before,
        last_seq=last,
        depth=before.depth + len(rows),
        bytes=before.bytes + sum(len(r[6]) for r in rows),
    )
    return out, after


def _append_one_by_one(
    db: sqlite3.Connection, batch: AppendBatch, before: QueueState, now_ms: int
) -> tuple[list[str], QueueState]:
    """The append at the depth limit or near the tenant's queued bytes: each entry refused,
    or stored (after the oldest one is dropped, at the depth limit), in turn; the outcomes
    and the queue's counters after."""
    tenant, queue_id, room = batch.tenant, batch.queue_id, batch.room_bytes
    out = []
    last, depth, dropped, held = before.last_seq, before.depth, before.dropped, before.bytes
    for item in batch.items:
        if _is_known_message(db, tenant, queue_id, item.message_id):
            out.append(AppendOutcome.DUPLICATE)
            continue
        if room is not None and held - before.bytes + len(item.data) > room:
            out.append(AppendOutcome.OVER_BYTES)
            continue
        if batch.max_depth and depth >= batch.max_depth:
            if not batch.drop_oldest:
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
    return out, replace(before, last_seq=last, depth=depth, dropped=dropped, bytes=held)


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
    db.execute(_INSERT_ENTRY, entry_row(tenant, queue_id, seq, item))
    db.execute(_INSERT_MSGID, (tenant, queue_id, item.message_id, seq, now_ms))
