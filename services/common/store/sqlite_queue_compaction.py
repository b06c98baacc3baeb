"""The embedded queue store's compaction deletes (analytics/jobs/queue_compaction.py), each
run inside the job's write transaction on the queues file.

The compaction job proposes keys it found from a snapshot of the tables; each delete re-checks
its condition inside the write transaction, so a row that is live by the time of the delete
stays. Every condition only ever goes from false to true (acked_through grows, an entry's
expiry is fixed, an expired session cannot be resumed, an incarnation never comes back), so a
row that passes the re-check can never be needed again.
"""

from __future__ import annotations

import sqlite3


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
