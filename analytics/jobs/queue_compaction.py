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
(services/common/store/sqlite_queue.py and cassandra_queue.py, "Compaction" sections), which
re-check each condition at delete time, so compaction is safe while the mesh runs: an entry
that is live when its delete runs stays. Reported counts are rows actually removed (on
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
from services.common.store.sqlite_queue import (
    MSGID_RETENTION_MS,
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
    """One DataFrame of candidate keys per category (one row per queue for queue entries)."""
    from pyspark.sql import functions as f

    entries = ctx.table("queue_entries", ["tenant", "queue_id", "seq", "expires_at_ms"])
    state = ctx.table("queue_state", ["tenant", "queue_id", "acked_through"])
    sessions = ctx.table("sessions", ["tenant", "client_id", "incarnation", "expires_at_ms"])
    with_ack = entries.join(state, ["tenant", "queue_id"], "left")
    per_queue = [f.min("seq").alias("lo"), f.max("seq").alias("hi"), f.count("*").alias("rows")]
    acked = (
        with_ack.where(f.col("seq") <= f.col("acked_through"))
        .groupBy("tenant", "queue_id")
        .agg(*per_queue)
    )
    expired = (
        with_ack.where(
            (f.col("expires_at_ms") > 0)
            & (f.col("expires_at_ms") < now_ms)
            & (f.col("acked_through").isNull() | (f.col("seq") > f.col("acked_through")))
        )
        .groupBy("tenant", "queue_id")
        .agg(*per_queue, f.collect_list("seq").alias("seqs"))
    )
    # queue_id is "<client_id>#<incarnation>" (services/queue/core.py); client ids may hold '#'.
    queues = state.select(
        "tenant",
        "queue_id",
        f.regexp_extract("queue_id", r"^(.*)#(\d+)$", 1).alias("client_id"),
        f.regexp_extract("queue_id", r"^(.*)#(\d+)$", 2).cast("long").alias("inc"),
    ).where(f.col("inc").isNotNull())
    s = sessions.select(
        "tenant",
        "client_id",
        f.col("incarnation").alias("current_inc"),
        f.col("expires_at_ms").alias("session_expires_at_ms"),
    )
    over = queues.join(s, ["tenant", "client_id"]).where(
        (f.col("current_inc") > f.col("inc"))
        | (f.col("session_expires_at_ms").isNotNull() & (f.col("session_expires_at_ms") <= now_ms))
    )
    sizes = entries.groupBy("tenant", "queue_id").agg(f.count("*").alias("rows"))
    session_queues = over.join(sizes, ["tenant", "queue_id"], "left").select(
        "tenant", "queue_id", "client_id", "inc", f.coalesce("rows", f.lit(0)).alias("rows")
    )
    # Cassandra keys a retained message by ((tenant, bucket), topic).
    key = ["tenant", "bucket", "topic"] if ctx.store.cassandra else ["tenant", "topic"]
    retained = ctx.table("retained", [*key, "expires_at_ms"]).where(
        (f.col("expires_at_ms") > 0) & (f.col("expires_at_ms") < now_ms)
    )
    out = {
        "acked": acked,
        "expired": expired,
        "session_queues": session_queues,
        "retained": retained,
    }
    if not ctx.store.cassandra:  # Cassandra's de-duplication rows expire by TTL
        out["msgids"] = ctx.table(
            "queue_msgids", ["tenant", "queue_id", "message_id", "created_at_ms"]
        ).where(f.col("created_at_ms") < now_ms - MSGID_RETENTION_MS)
    return out


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


def _rows_of(row: Any) -> int:
    """Entries a candidate row stands for (one per key where it is not a queue summary)."""
    return int(row["rows"]) if "rows" in row.__fields__ else 1


def delete_sqlite(
    ctx: JobContext, found: dict[str, DataFrame], now_ms: int
) -> tuple[dict[str, Counter[str]], dict[str, int]]:
    """Run the conditional deletes for every candidate, batch by batch, from the driver (one
    writer per SQLite file anyway). Returns the rows removed and the candidates seen."""
    removed: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
    planned = dict.fromkeys(found, 0)
    data = ctx.store.sqlite or ""
    size = ctx.settings.analytics_delete_batch
    qdb = _open(sqlite_file(data, "queue_entries"))
    qdb.execute("ATTACH DATABASE ? AS s", (str(sqlite_file(data, "sessions")),))
    try:
        # Whole queues first: their entries are then not counted again as acked or expired.
        def sessions(batch: list[Any]) -> None:
            for r in batch:
                n = compact_session_queue(qdb, "s", r.tenant, r.client_id, r.inc, now_ms)
                if n >= 0:
                    removed["session_queues"][r.tenant] += n

        def acked(batch: list[Any]) -> None:
            for r in batch:
                removed["acked"][r.tenant] += compact_acked(qdb, r.tenant, r.queue_id, r.hi)

        def expired(batch: list[Any]) -> None:
            for r in batch:
                n = compact_expired(qdb, r.tenant, r.queue_id, r.lo, r.hi, now_ms)
                removed["expired"][r.tenant] += n

        def msgids(batch: list[Any]) -> None:
            before = now_ms - MSGID_RETENTION_MS
            for r in batch:
                key = (r.tenant, r.queue_id, r.message_id)
                removed["msgids"][r.tenant] += compact_msgids(qdb, [key], before)

        steps = [("session_queues", sessions), ("acked", acked), ("expired", expired)]
        steps.append(("msgids", msgids))
        for name, fn in steps:
            rows = found[name].drop("seqs") if name == "expired" else found[name]
            for batch in _batches(rows.toLocalIterator(prefetchPartitions=True), size):
                planned[name] += sum(_rows_of(r) for r in batch)
                _tx(qdb, fn, batch)
    finally:
        qdb.close()
    rdb = _open(sqlite_file(data, "retained"))
    try:

        def retained(batch: list[Any]) -> None:
            for r in batch:
                removed["retained"][r.tenant] += compact_retained(rdb, r.tenant, r.topic, now_ms)

        for batch in _batches(found["retained"].toLocalIterator(), size):
            planned["retained"] += len(batch)
            _tx(rdb, retained, batch)
    finally:
        rdb.close()
    return removed, planned


def delete_cassandra(
    ctx: JobContext, found: dict[str, DataFrame], now_ms: int
) -> tuple[dict[str, Counter[str]], dict[str, int]]:
    """Run the conditional deletes in the executors, each partition with its own driver
    session (synchronous calls: an executor task has nothing else to do meanwhile)."""
    from analytics.source import CassandraTarget

    target = CassandraTarget(ctx.store.cassandra, ctx.store.port, ctx.store.keyspace, "")
    ks = ctx.store.keyspace

    def work(category: str) -> Any:
        def part(rows: Iterator[Any]) -> Iterator[tuple[str, int, int]]:
            from services.common.store import cassandra_queue as cq

            cluster, session = target.session()
            try:
                for r in rows:
                    if category == "session_queues":
                        ok = cq.cassandra_compact_session_queue(
                            session, ks, r.tenant, r.client_id, r.inc, now_ms
                        )
                        yield r.tenant, r.rows if ok else 0, r.rows
                    elif category == "acked":
                        through = cq.cassandra_compact_acked(
                            session, ks, r.tenant, r.queue_id, r.lo, r.hi
                        )
                        yield r.tenant, r.rows if through >= r.hi else 0, r.rows
                    elif category == "expired":
                        yield (
                            r.tenant,
                            cq.cassandra_compact_expired(
                                session, ks, r.tenant, r.queue_id, list(r.seqs)
                            ),
                        )
                    else:  # retained: a compare-and-set on the expiry the scan saw
                        applied = session.execute(
                            f"DELETE FROM {ks}.retained WHERE tenant=%s AND bucket=%s "
                            "AND topic=%s IF expires_at_ms=%s",
                            (r.tenant, r.bucket, r.topic, r.expires_at_ms),
                        ).one()[0]
                        yield r.tenant, int(bool(applied)), 1
            finally:
                cluster.shutdown()

        return part

    removed: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
    planned = dict.fromkeys(found, 0)
    for category in ("session_queues", "acked", "expired", "retained"):
        for tenant, n, seen in found[category].rdd.mapPartitions(work(category)).collect():
            removed[category][tenant] += n
            planned[category] += seen
    return removed, planned


# ---- the job ------------------------------------------------------------------------------


def run(ctx: JobContext, args: argparse.Namespace) -> dict[str, Any]:
    now_ms = int(getattr(args, "now_ms", None) or time.time() * 1000)
    started = time.monotonic()
    found = candidates(ctx, now_ms)
    scanned = ctx.table("queue_entries", ["tenant"]).count()
    if getattr(args, "dry_run", False):
        removed: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
        planned = {k: _count(v) for k, v in found.items()}
    elif ctx.store.cassandra:
        removed, planned = delete_cassandra(ctx, found, now_ms)
    else:
        removed, planned = delete_sqlite(ctx, found, now_ms)
    wall = time.monotonic() - started
    tenants = sorted({t for c in removed.values() for t in c})
    return {
        "now_ms": now_ms,
        "entries_scanned": scanned,
        "rows_per_s": round(scanned / wall) if wall else 0,
        "candidates": planned,
        "removed": {c: dict(sorted(removed[c].items())) for c in CATEGORIES},
        "removed_total": {c: sum(removed[c].values()) for c in CATEGORIES},
        "by_tenant": {t: {c: removed[c][t] for c in CATEGORIES} for t in tenants},
    }


def _count(df: DataFrame) -> int:
    from pyspark.sql import functions as f

    if "rows" in df.columns:
        return int(df.agg(f.coalesce(f.sum("rows"), f.lit(0))).first()[0])
    return df.count()
