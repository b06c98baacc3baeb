"""Queue compaction: remove what the store keeps but nobody can receive any more.

Categories, per tenant:
- `acked`: queue entries at or below their queue's acked_through (an ack whose deletes did
  not all land);
- `expired`: entries whose message expiry passed (expires_at_ms > 0 and < now);
- `session_queues`: every entry (and the state and de-duplication rows) of a queue whose
  session incarnation is over: its session record expired, or belongs to a later
  incarnation;
- `retained`: retained messages past their expiry;
- `msgids`: de-duplication records older than the queue's window (MSGID_RETENTION_MS; the
  embedded store only: Cassandra's carry a TTL).

Spark finds candidates from a scan; the deletes are the store's conditional deletes
(services/common/store/sqlite_queue_compaction.py and cassandra_queue_compaction.py), which re-check
each condition at delete time, so compaction is safe while the mesh runs: an entry that is
live when its delete runs stays. On Cassandra the scans read at LOCAL_QUORUM (analytics/
source_cassandra.py) and a decision that deletes is re-read first: a session's end at SERIAL
(`session_over`), an expired retained message at LOCAL_QUORUM and deleted at its own write
time (`retained_removed`). Reported counts are rows actually removed (on
Cassandra, which does not count deletes, the candidates whose re-check passed). Idempotent
and restartable: each batch commits on its own and a second run finds nothing left.
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics.source import sqlite_file
from services.common.store.sqlite_queue import MSGID_RETENTION_MS
from services.common.store.sqlite_queue_compaction import (
    compact_acked,
    compact_expired,
    compact_msgids,
    compact_session_queue,
)
from services.common.store.sqlite_router import compact_retained

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from analytics.jobs.context import JobContext

HELP = "drop acked and expired queue entries, queues of expired sessions, expired retained"
CATEGORIES = ("acked", "expired", "session_queues", "retained", "msgids")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="report the candidates, delete nothing")
    p.add_argument(
        "--now-ms", type=int, default=0, help="judge expiry as of this time (default: now)"
    )


# ---- candidates (Spark) -------------------------------------------------------------------


def candidates(ctx: JobContext, now_ms: int) -> dict[str, DataFrame]:
    """Candidates in one scan of each table: `queues` has one row per queue (entries, the
    acked and expired ones with their seq bounds, whether its session incarnation is over);
    `retained` and `msgids` one row per key."""
    from pyspark.sql import functions as f

    sessions = ctx.table("sessions", ["tenant", "client_id", "incarnation", "expires_at_ms"])
    s = sessions.select(
        "tenant",
        "client_id",
        f.col("incarnation").alias("current_inc"),
        f.col("expires_at_ms").alias("session_expires_at_ms"),
    )
    over = (f.col("current_inc") > f.col("inc")) | (
        f.col("session_expires_at_ms").isNotNull() & (f.col("session_expires_at_ms") <= now_ms)
    )
    queues = (
        _per_queue(ctx, now_ms)
        .join(s, ["tenant", "client_id"], "left")
        .withColumn("over", f.coalesce(over & f.col("inc").isNotNull(), f.lit(False)))
    )
    # Cassandra keys a retained message by ((tenant, bucket), topic).
    key = ["tenant", "bucket", "topic"] if ctx.store.cassandra else ["tenant", "topic"]
    retained = ctx.table("retained", [*key, "expires_at_ms"]).where(
        (f.col("expires_at_ms") > 0) & (f.col("expires_at_ms") < now_ms)
    )
    out = {"queues": queues, "retained": retained}
    if not ctx.store.cassandra:  # Cassandra's de-duplication rows expire by TTL
        out["msgids"] = ctx.table(
            "queue_msgids", ["tenant", "queue_id", "message_id", "created_at_ms"]
        ).where(f.col("created_at_ms") < now_ms - MSGID_RETENTION_MS)
    return out


def _per_queue(ctx: JobContext, now_ms: int) -> DataFrame:
    """One row per queue: its entries, the acked and expired ones with their seq bounds
    (and on Cassandra the expired seqs), its client id and incarnation."""
    from pyspark.sql import functions as f

    entries, state = _queue_tables(ctx)
    # Full join: a queue with state but no entries left can still be a dead session's.
    both = entries.join(state, ["tenant", "queue_id"], "full")
    seq, acked_through = f.col("seq"), f.col("acked_through")
    is_acked = seq <= acked_through
    is_expired = (
        (f.col("expires_at_ms") > 0)
        & (f.col("expires_at_ms") < now_ms)
        & (acked_through.isNull() | (seq > acked_through))
    )
    aggs = [
        f.count(seq).alias("rows"),
        f.count(f.when(is_acked, 1)).alias("acked_rows"),
        f.min(f.when(is_acked, seq)).alias("acked_lo"),
        f.max(f.when(is_acked, seq)).alias("acked_hi"),
        f.count(f.when(is_expired, 1)).alias("expired_rows"),
        f.min(f.when(is_expired, seq)).alias("expired_lo"),
        f.max(f.when(is_expired, seq)).alias("expired_hi"),
    ]
    if ctx.store.cassandra:  # deleted by key there (collect_list skips the nulls)
        aggs.append(f.collect_list(f.when(is_expired, seq)).alias("seqs"))
    per_queue = both.groupBy("tenant", "queue_id").agg(*aggs)
    # queue_id is "<client_id>#<incarnation>" (services/queue/core.py); client ids may hold '#'.
    return per_queue.withColumn(
        "client_id", f.regexp_extract("queue_id", r"^(.*)#(\d+)$", 1)
    ).withColumn("inc", f.regexp_extract("queue_id", r"^(.*)#(\d+)$", 2).cast("long"))


def _queue_tables(ctx: JobContext) -> tuple[DataFrame, DataFrame]:
    """(entries: tenant, queue_id, seq, expires_at_ms; state: tenant, queue_id,
    acked_through). Cassandra keeps a queue in one `queue_log` partition: its entries are the
    rows with seq >= 1 and mid '' (seq 0 holds message ids), its state static columns, on
    every row (and alone on a queue with no rows left)."""
    from pyspark.sql import functions as f

    if not ctx.store.cassandra:
        entries = ctx.table("queue_entries", ["tenant", "queue_id", "seq", "expires_at_ms"])
        return entries, ctx.table("queue_state", ["tenant", "queue_id", "acked_through"])
    log = ctx.table(
        "queue_log", ["tenant", "queue_id", "seq", "mid", "acked_through", "expires_at_ms"]
    )
    entries = log.where((f.col("mid") == "") & (f.col("seq") >= 1)).select(
        "tenant", "queue_id", "seq", "expires_at_ms"
    )
    state = log.groupBy("tenant", "queue_id").agg(f.max("acked_through").alias("acked_through"))
    return entries, state


def plan_queue(r: Any) -> dict[str, int]:
    """The rows each category would remove from this queue (a row of `queues`)."""
    if r.over:
        return {"session_queues": r.rows}
    return {"acked": r.acked_rows, "expired": r.expired_rows}


# ---- deletes ------------------------------------------------------------------------------


def _batches(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for r in rows:
        batch.append(r)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _tx(db: sqlite3.Connection, fn: Any, batch: list[Any]) -> None:
    """One short IMMEDIATE transaction per batch: the services' writers wait at most that."""
    db.execute("BEGIN IMMEDIATE")
    try:
        fn(batch)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    db.execute("PRAGMA busy_timeout=30000")
    db.execute("PRAGMA synchronous=FULL")
    return db


class Tally:
    """Rows removed and candidates seen, per category (and tenant for removals), and the
    queue entries the scan saw."""

    def __init__(self) -> None:
        self.removed: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
        self.planned: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.scanned = 0

    def plan(self, category: str, n: int) -> None:
        self.planned[category] += n


def scan_only(found: dict[str, DataFrame]) -> Tally:
    """A dry run: count the candidates, delete nothing."""
    tally = Tally()
    for r in found["queues"].toLocalIterator(prefetchPartitions=True):
        tally.scanned += r.rows
        for category, n in plan_queue(r).items():
            tally.plan(category, n)
    for name in ("retained", "msgids"):
        if name in found:
            tally.plan(name, found[name].count())
    return tally


def delete_sqlite(ctx: JobContext, found: dict[str, DataFrame], now_ms: int) -> Tally:
    """Run the conditional deletes for every candidate, batch by batch, from the driver (one
    writer per SQLite file anyway)."""
    tally = Tally()
    data = ctx.store.sqlite or ""
    size = ctx.settings.analytics_delete_batch
    qdb = _open(sqlite_file(data, "queue_entries"))
    qdb.execute("ATTACH DATABASE ? AS s", (str(sqlite_file(data, "sessions")),))
    try:
        _delete_queues(qdb, found, size, now_ms, tally)
    finally:
        qdb.close()
    rdb = _open(sqlite_file(data, "retained"))
    removed = tally.removed
    try:

        def retained(batch: list[Any]) -> None:
            for r in batch:
                removed["retained"][r.tenant] += compact_retained(rdb, r.tenant, r.topic, now_ms)

        for batch in _batches(found["retained"].toLocalIterator(), size):
            tally.plan("retained", len(batch))
            _tx(rdb, retained, batch)
    finally:
        rdb.close()
    return tally


def _delete_queues(
    qdb: sqlite3.Connection, found: dict[str, DataFrame], size: int, now_ms: int, tally: Tally
) -> None:
    """The queue candidates' deletes (queues, then de-duplication ids) on the queue file
    (the sessions file attached as `s`)."""
    removed = tally.removed

    def queues(batch: list[Any]) -> None:
        for r in batch:
            t = r.tenant
            if r.over:  # the whole queue, and nothing of it counted as acked or expired
                n = compact_session_queue(qdb, "s", t, r.client_id, r.inc, now_ms)
                if n >= 0:
                    removed["session_queues"][t] += n
                    continue
            if r.acked_rows:
                removed["acked"][t] += compact_acked(qdb, t, r.queue_id, r.acked_hi)
            if r.expired_rows:
                removed["expired"][t] += compact_expired(
                    qdb, t, r.queue_id, r.expired_lo, r.expired_hi, now_ms
                )

    def msgids(batch: list[Any]) -> None:
        before = now_ms - MSGID_RETENTION_MS
        for r in batch:
            key = (r.tenant, r.queue_id, r.message_id)
            removed["msgids"][r.tenant] += compact_msgids(qdb, [key], before)

    todo: list[Any] = []
    for r in found["queues"].toLocalIterator(prefetchPartitions=True):
        tally.scanned += r.rows
        planned = plan_queue(r)
        if any(planned.values()) or r.over:
            for category, n in planned.items():
                tally.plan(category, n)
            todo.append(r)
        if len(todo) >= size:
            _tx(qdb, queues, todo)
            todo = []
    if todo:
        _tx(qdb, queues, todo)
    if "msgids" in found:
        for batch in _batches(found["msgids"].toLocalIterator(prefetchPartitions=True), size):
            tally.plan("msgids", len(batch))
            _tx(qdb, msgids, batch)


def tally_of(results: list[tuple[str, str, int, int]]) -> Tally:
    """The Tally of (tenant, category, removed, candidates) results ("scanned": entries)."""
    tally = Tally()
    for tenant, category, n, seen in results:
        if category == "scanned":
            tally.scanned += seen
            continue
        tally.removed[category][tenant] += n
        tally.plan(category, seen)
    return tally


# ---- the job ------------------------------------------------------------------------------


def run(ctx: JobContext, args: argparse.Namespace) -> dict[str, Any]:
    now_ms = int(getattr(args, "now_ms", None) or time.time() * 1000)
    started = time.monotonic()
    found = candidates(ctx, now_ms)
    if getattr(args, "dry_run", False):
        tally = scan_only(found)
    elif ctx.store.cassandra:
        from analytics.jobs.compaction_cassandra import delete_cassandra

        tally = tally_of(delete_cassandra(ctx, found, now_ms))
    else:
        tally = delete_sqlite(ctx, found, now_ms)
    wall = time.monotonic() - started
    removed = tally.removed
    tenants = sorted({t for c in removed.values() for t in c})
    return {
        "now_ms": now_ms,
        "entries_scanned": tally.scanned,
        "rows_per_s": round(tally.scanned / wall) if wall else 0,
        "candidates": tally.planned,
        "removed": {c: dict(sorted(removed[c].items())) for c in CATEGORIES},
        "removed_total": {c: sum(removed[c].values()) for c in CATEGORIES},
        "by_tenant": {t: {c: removed[c][t] for c in CATEGORIES} for t in tenants},
    }
