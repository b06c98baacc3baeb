"""bench/analytics_store.py builds the analytics bench's stores with raw INSERTs for speed:
the services' own store classes must read them back, so a column added to a table cannot
break the bench unseen."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.analytics_store import ROWS_PER_QUEUE, build_store
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.sqlite_session import SqliteSessionStore


def test_the_bench_store_reads_back_through_the_services_store_classes(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    expect = build_store(tmp_path, 2 * ROWS_PER_QUEUE, now_ms)  # (runs its own event loop)
    assert expect["session_queues"] == ROWS_PER_QUEUE  # the 2nd queue's session expired
    asyncio.run(_read_back(tmp_path, now_ms))


async def _read_back(tmp_path: Path, now_ms: int) -> None:
    sessions = SqliteSessionStore(tmp_path / "sessions.db")
    try:
        live = await sessions.get_session("t0", "c0")
        assert live is not None and live.incarnation == 1
        expired = await sessions.expired_sessions(now_ms)
        assert [(r.tenant, r.client_id) for r in expired] == [("t0", "c1")]
    finally:
        await sessions.close()

    queues = SqliteQueueStore(tmp_path / "queues.db")
    try:
        entries, state = await queues.read("t0", "c1#1", 1, 10)
        assert state.last_seq == ROWS_PER_QUEUE and [e.seq for e in entries] == list(range(1, 11))
    finally:
        await queues.close()
