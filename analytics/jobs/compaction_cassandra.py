"""Queue compaction's deletes on Cassandra (analytics/jobs/queue_compaction.py finds the
candidates): run in the executors, each input partition with its own driver session
(synchronous calls: an executor task has nothing else to do meanwhile).

Every decision that deletes is taken again on the row itself, never on the scan alone (the
scan reads at LOCAL_QUORUM and may be minutes old): a session's end is re-read at SERIAL
(`session_over`), the queue's own deletes are conditional (services/common/store/
cassandra_queue_compaction.py), and an expired retained message is re-read and deleted at
its own write time (`retained_removed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from analytics.jobs.context import JobContext

Result = tuple[str, str, int, int]  # (tenant, category, removed, candidates)


def delete_cassandra(ctx: JobContext, found: dict[str, DataFrame], now_ms: int) -> list[Result]:
    """Every candidate's conditional delete, run in the executors; their results."""
    from analytics.source import CassandraTarget

    target = CassandraTarget(ctx.store.cassandra, ctx.store.port, ctx.store.keyspace, "")
    ks = ctx.store.keyspace

    def queue_part(rows: Iterable[Any]) -> Iterator[Result]:
        cluster, session = target.session()
        try:
            for r in rows:
                yield from queue_deletes(session, ks, r, now_ms)
        finally:
            cluster.shutdown()

    def retained_part(rows: Iterable[Any]) -> Iterator[Result]:
        cluster, session = target.session()
        try:
            for r in rows:
                yield r.tenant, "retained", retained_removed(session, ks, r, now_ms), 1
        finally:
            cluster.shutdown()

    results: list[Result] = found["queues"].rdd.mapPartitions(queue_part).collect()
    return results + found["retained"].rdd.mapPartitions(retained_part).collect()


def queue_deletes(session: Any, ks: str, r: Any, now_ms: int) -> Iterator[Result]:
    """The deletes of one queue (a row of the candidates' `queues`)."""
    from services.common.store import cassandra_queue as cq

    yield r.tenant, "scanned", 0, r.rows
    # The scan's verdict is decided again on the session row at SERIAL: a scan at
    # LOCAL_QUORUM may predate a resume, and this decision deletes a whole queue.
    if r.over and session_over(session, ks, r, now_ms):
        ok = cq.cassandra_compact_session_queue(session, ks, r.tenant, r.client_id, r.inc, now_ms)
        yield r.tenant, "session_queues", r.rows if ok else 0, r.rows
        if ok:
            return
    if r.acked_rows:
        through = cq.cassandra_compact_acked(
            session, ks, r.tenant, r.queue_id, r.acked_lo, r.acked_hi
        )
        yield r.tenant, "acked", r.acked_rows if through >= r.acked_hi else 0, r.acked_rows
    if r.expired_rows:
        n = cq.cassandra_compact_expired(session, ks, r.tenant, r.queue_id, list(r.seqs))
        yield r.tenant, "expired", n, r.expired_rows


def session_over(session: Any, ks: str, r: Any, now_ms: int) -> bool:
    """Whether the incarnation of queue row `r` is over, read now at SERIAL (every committed
    compare-and-set of the session row is seen). No session record: left alone."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    stmt = SimpleStatement(
        f"SELECT incarnation, expires_at_ms FROM {ks}.sessions WHERE tenant=%s AND client_id=%s",
        consistency_level=ConsistencyLevel.SERIAL,
    )
    rows = list(session.execute(stmt, (r.tenant, r.client_id)))
    if not rows:
        return False
    incarnation, expires = rows[0][0], rows[0][1]
    return bool(incarnation > r.inc or (expires is not None and expires <= now_ms))


def retained_removed(session: Any, ks: str, r: Any, now_ms: int) -> int:
    """Delete an expired retained message at its own write time: the row is written only by
    plain writes (never an LWT: the two are ordered by different clocks), and a delete
    `USING TIMESTAMP` of the row read cannot shadow a newer set of the topic. 1 if deleted."""
    key = (r.tenant, r.bucket, r.topic)
    rows = list(
        session.execute(
            f"SELECT expires_at_ms, WRITETIME(data) FROM {ks}.retained "
            "WHERE tenant=%s AND bucket=%s AND topic=%s",
            key,
        )
    )
    if not rows:
        return 0
    expires, written = rows[0][0], rows[0][1]
    if not (expires and expires < now_ms) or written is None:
        return 0  # replaced since the scan by a message that has not expired
    session.execute(
        f"DELETE FROM {ks}.retained USING TIMESTAMP %s WHERE tenant=%s AND bucket=%s AND topic=%s",
        (written, *key),
    )
    return 1
