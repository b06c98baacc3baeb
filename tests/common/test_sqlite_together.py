"""Reads made in the same event-loop turn share one trip to the SQLite worker thread
(`SqliteDb.run_together`, used by the session read of every CONNECT): each caller still gets
its own row, its own error, and sees what was committed before it asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.store.ports_session import SessionRecord
from services.common.store.sqlite_session import SqliteSessionStore


async def test_concurrent_reads_each_get_their_own_record(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.db")
    try:
        for i in range(0, 300, 2):  # every other client id has a session
            await store.put_session(SessionRecord("t", f"c{i}", i + 1, 60, True, owner=f"u{i}"))
        got = await asyncio.gather(*(store.get_session("t", f"c{i}") for i in range(300)))
        for i, rec in enumerate(got):
            if i % 2:
                assert rec is None
            else:
                assert rec is not None and (rec.client_id, rec.incarnation) == (f"c{i}", i + 1)
                assert rec.owner == f"u{i}"
    finally:
        await store.close()


async def test_one_failing_read_fails_alone(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.db")
    try:
        await store.put_session(SessionRecord("t", "c", 7, 60, True))

        def broken() -> int:
            raise ValueError("this read fails")

        results = await asyncio.gather(
            store.get_session("t", "c"),
            store.run_together(broken),
            store.run_together(lambda: 42),
            return_exceptions=True,
        )
        assert isinstance(results[0], SessionRecord) and results[0].incarnation == 7
        assert isinstance(results[1], ValueError)
        assert results[2] == 42
        with pytest.raises(ValueError):
            await store.run_together(broken)
    finally:
        await store.close()
