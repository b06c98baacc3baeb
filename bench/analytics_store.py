"""The analytics benchmark's store files: a synthetic embedded store (queues.db, sessions.db,
router.db) whose compaction outcome is known in advance.

The files are created by the services' own store classes (so the schema is theirs) and filled
directly with sqlite3 executemany, far faster than appending through the queue service.
bench/analytics.py scans and compacts them; tests/bench/test_analytics_store.py reads them
back through the store classes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

QUEUES_PER_TENANT = 100
ROWS_PER_QUEUE = 1000
PAYLOAD = b"p" * 64


async def _schemas(data: Path) -> None:
    """Create the store files with the services' own schema code."""
    from services.common.store.sqlite_queue import SqliteQueueStore
    from services.common.store.sqlite_router import SqliteRouterStore
    from services.common.store.sqlite_session import SqliteSessionStore

    for cls, name in (
        (SqliteQueueStore, "queues.db"),
        (SqliteSessionStore, "sessions.db"),
        (SqliteRouterStore, "router.db"),
    ):
        store = cls(data / name)
        await store.close()


def build_store(data: Path, rows: int, now_ms: int) -> dict[str, int]:
    """`rows` queue entries in queues of ROWS_PER_QUEUE. Of the queues: every 2nd has
    acked_through 300 with those rows still present (an ack whose delete did not land),
    every 10th belongs to an expired session; every 4th entry expired a minute ago. Returns
    the rows each category should remove."""
    asyncio.run(_schemas(data))
    queues = max(1, rows // ROWS_PER_QUEUE)
    expect = _fill_queues(data / "queues.db", queues, now_ms)
    _fill_sessions(data / "sessions.db", queues, now_ms)
    return expect


def _fill_queues(path: Path, queues: int, now_ms: int) -> dict[str, int]:
    """The entries and state of `queues` queues; the rows compaction should remove."""
    q = sqlite3.connect(path)
    q.execute("PRAGMA synchronous=OFF")
    q.execute("PRAGMA journal_mode=OFF")
    expect = {"acked": 0, "expired": 0, "session_queues": 0}
    q.execute("BEGIN")
    states = []
    for qn in range(queues):
        q.executemany(
            "INSERT INTO queue_entries (tenant, queue_id, bucket, seq, message_id, qos, data, "
            "expires_at_ms, released) VALUES (?,?,?,?,?,?,?,?,?)",
            _entries(qn, now_ms),
        )
        acked = 300 if qn % 2 == 0 else 0
        states.append(_state(qn, acked))
        if qn % 10 == 1:
            expect["session_queues"] += ROWS_PER_QUEUE
        else:
            expect["acked"] += acked
            expect["expired"] += sum(1 for s in range(acked + 1, ROWS_PER_QUEUE + 1) if s % 4 == 0)
    q.executemany(
        "INSERT INTO queue_state (tenant, queue_id, last_seq, acked_through, depth, dropped, "
        "delivered_through, bytes) VALUES (?,?,?,?,?,?,?,?)",
        states,
    )
    q.execute("COMMIT")
    q.close()
    return expect


def _entries(qn: int, now_ms: int) -> list[tuple[object, ...]]:
    """Queue `qn`'s rows of queue_entries: every 4th expired a minute before `now_ms`."""
    tenant, qid = f"t{qn // QUEUES_PER_TENANT}", f"c{qn}#1"
    return [
        (tenant, qid, 0, s, f"m{qn}-{s}", 1, PAYLOAD, now_ms - 60_000 if s % 4 == 0 else 0, 0)
        for s in range(1, ROWS_PER_QUEUE + 1)
    ]


def _state(qn: int, acked: int) -> tuple[object, ...]:
    """Queue `qn`'s row of queue_state, acknowledged through `acked`."""
    return (
        f"t{qn // QUEUES_PER_TENANT}",
        f"c{qn}#1",
        ROWS_PER_QUEUE,
        acked,
        ROWS_PER_QUEUE - acked,
        0,
        0,
        (ROWS_PER_QUEUE - acked) * len(PAYLOAD),  # bytes held
    )


def _fill_sessions(path: Path, queues: int, now_ms: int) -> None:
    """One disconnected session per queue; every 10th (from the 2nd) expired a minute ago."""
    s = sqlite3.connect(path)
    s.executemany(
        "INSERT INTO sessions (tenant, client_id, incarnation, expiry_interval_s, connected, "
        "disconnected_at_ms, expires_at_ms, owner) VALUES (?,?,?,?,?,?,?,?)",
        [
            (f"t{qn // QUEUES_PER_TENANT}", f"c{qn}", 1, 60, 0, now_ms - 3_600_000,
             now_ms - 3_540_000 if qn % 10 == 1 else now_ms + 3_600_000, None)
            for qn in range(queues)
        ],
    )  # fmt: skip
    s.commit()
    s.close()
