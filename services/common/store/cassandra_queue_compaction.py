"""Compaction of the Cassandra queue table (analytics/jobs/queue_compaction.py calls the
`cassandra_compact_*` functions from Spark executors with their own driver session).

Each function is a plan of statements (a generator: it yields a statement, gets its rows back,
None when the outcome of a lightweight transaction is unknown) run synchronously by `run`;
tests/simulation runs the same plans on its model of Cassandra. Every delete is conditional on
the state it depends on, decided by Paxos on the queue's partition, never on what the job's scan
saw: acked entries go in a batch conditioned on `acked_through >= through` (the static column
as committed), an expired entry with `IF expires_at_ms ...` on its own row (a queue dropped and
begun again reuses seqs), a finished session's queue like `drop` (`IF version = ?`, the version
read at serial consistency). As on SQLite every condition only goes from false to true, so a
row that passed can never be needed again.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from services.common import clock

Step = tuple[str, tuple[Any, ...], bool]  # CQL with %s, values, read at serial consistency
Plan = Generator[Step, list[Any] | None, Any]
_LAST = (1 << 63) - 1
# The re-check of an expired entry, decided by Paxos on its row (the scan saw it expired,
# but the queue may have been dropped and begun again at the same seq since).
EXPIRED_IF = "IF expires_at_ms>0 AND expires_at_ms<=%s"


def run(session: Any, plan: Plan) -> Any:
    """Run a plan on a synchronous driver session; its result."""
    from cassandra import ConsistencyLevel, WriteTimeout, WriteType
    from cassandra.query import SimpleStatement

    rows: list[Any] | None = None
    try:
        step = next(plan)
        while True:
            query, values, serial = step
            stmt = (
                SimpleStatement(query, consistency_level=ConsistencyLevel.SERIAL)
                if serial
                else query
            )
            try:
                rows = list(session.execute(stmt, values))
            except WriteTimeout as exc:
                if exc.write_type != WriteType.CAS:
                    raise
                rows = None
            step = plan.send(rows)
    except StopIteration as done:
        return done.value


def _applied(rows: list[Any] | None) -> bool:
    return bool(rows and rows[0][0])


def acked_plan(ks: str, tenant: str, queue_id: str, lo_seq: int, through_seq: int) -> Plan:
    """Range-delete entries in [lo_seq, min(through_seq, acked_through)] in a batch whose
    condition is acked_through >= the bound. The bound used, -1 when nothing in range is
    acknowledged."""
    state = (
        f"SELECT DISTINCT tenant, queue_id, acked_through FROM {ks}.queue_log "
        "WHERE tenant=%s AND queue_id=%s"
    )
    batch = (
        f"BEGIN BATCH UPDATE {ks}.queue_log SET compacted_through=%s WHERE tenant=%s AND "
        "queue_id=%s IF acked_through>=%s; "
        f"DELETE FROM {ks}.queue_log WHERE tenant=%s AND queue_id=%s AND seq>=%s AND seq<=%s; "
        "APPLY BATCH"
    )
    through = through_seq
    while True:
        rows = yield (state, (tenant, queue_id), True)
        acked = rows[0][2] if rows else None
        if acked is None:
            return -1
        through = min(through_seq, acked)
        if through < lo_seq:
            return -1
        res = yield (
            batch,
            (through, tenant, queue_id, through, tenant, queue_id, lo_seq, through),
            False,
        )
        if _applied(res):
            return int(through)


def expired_plan(ks: str, tenant: str, queue_id: str, seqs: list[int], now_ms: int) -> Plan:
    """Delete each entry of `seqs` whose expiry (fixed at append) has passed `now_ms`, each
    conditional on its own row; how many went."""
    delete = (
        f"DELETE FROM {ks}.queue_log WHERE tenant=%s AND queue_id=%s AND seq=%s AND mid='' "
        + EXPIRED_IF
    )
    n = 0
    for seq in seqs:
        now = (now_ms,) if "%s" in EXPIRED_IF else ()  # a test removes the condition
        res = yield (delete, (tenant, queue_id, seq, *now), False)
        n += 1 if "%s" not in EXPIRED_IF else _applied(res)
    return n


def session_queue_plan(ks: str, tenant: str, client_id: str, incarnation: int, now_ms: int) -> Plan:
    """Drop the queue of a session incarnation that is over (its record, read now, expired or
    belongs to a later incarnation); False when the re-check kept it."""
    rows = yield (
        f"SELECT incarnation, expires_at_ms FROM {ks}.sessions WHERE tenant=%s AND client_id=%s",
        (tenant, client_id),
        False,
    )
    if not rows:
        return False
    inc, expires = rows[0][0], rows[0][1]
    if not (inc > incarnation or (expires is not None and expires <= now_ms)):
        return False
    qid = f"{client_id}#{incarnation}"
    state = (
        f"SELECT DISTINCT tenant, queue_id, version FROM {ks}.queue_log "
        "WHERE tenant=%s AND queue_id=%s"
    )
    drop = (
        f"BEGIN BATCH DELETE owner_epoch, version, last_seq, acked_through, depth, dropped, "
        "delivered_through, appended_bytes, acked_bytes, compacted_through "
        f"FROM {ks}.queue_log WHERE tenant=%s AND queue_id=%s IF version=%s; "
        f"DELETE FROM {ks}.queue_log WHERE tenant=%s AND queue_id=%s AND seq>=0 AND seq<=%s; "
        "APPLY BATCH"
    )
    while True:
        rows = yield (state, (tenant, qid), True)
        version = rows[0][2] if rows else None
        if version is None:
            return True  # no queue (left)
        res = yield (drop, (tenant, qid, version, tenant, qid, _LAST), False)
        if _applied(res):
            return True


def cassandra_compact_acked(
    session: Any, keyspace: str, tenant: str, queue_id: str, lo_seq: int, through_seq: int
) -> int:
    """`acked_plan` on a driver session."""
    return int(run(session, acked_plan(keyspace, tenant, queue_id, lo_seq, through_seq)))


def cassandra_compact_expired(
    session: Any,
    keyspace: str,
    tenant: str,
    queue_id: str,
    seqs: list[int],
    now_ms: int | None = None,
) -> int:
    """`expired_plan` on a driver session (`now_ms`: the wall clock unless given)."""
    now = clock.now_ms() if now_ms is None else now_ms
    return int(run(session, expired_plan(keyspace, tenant, queue_id, seqs, now)))


def cassandra_compact_session_queue(
    session: Any, keyspace: str, tenant: str, client_id: str, incarnation: int, now_ms: int
) -> bool:
    """`session_queue_plan` on a driver session."""
    return bool(run(session, session_queue_plan(keyspace, tenant, client_id, incarnation, now_ms)))
