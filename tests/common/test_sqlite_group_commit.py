"""Group commit of the embedded queue store (services/common/store/group_commit.py): many
concurrent writes, few transactions, each caller answered only once its write is on disk,
and one caller's failure undoes its own writes only."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from services.common.store.ports_queue import AppendOutcome, NewQueueItem
from services.common.store.sqlite_queue import SqliteQueueStore
from tests.poll import eventually


def _item(i: int) -> NewQueueItem:
    return NewQueueItem(f"m{i}", 1, f"payload-{i}".encode())


async def test_concurrent_appends_share_transactions_and_all_survive_a_reopen(
    tmp_path: Path,
) -> None:
    store = SqliteQueueStore(tmp_path / "q.db")
    epoch = await store.claim_partition(0)
    before = store.group.commits
    reports = await asyncio.gather(
        *(store.append("t", f"c{i}#1", [_item(i)], 0, epoch, 0, True) for i in range(50))
    )
    assert all(r.outcomes == [AppendOutcome.OK] for r in reports)
    assert store.group.commits - before <= 3  # not one transaction (one fsync) per append
    await store.close()
    again = SqliteQueueStore(tmp_path / "q.db")
    for i in range(50):
        entries, st = await again.read("t", f"c{i}#1", 1, 10)
        assert [e.data for e in entries] == [f"payload-{i}".encode()] and st.last_seq == 1
    await again.close()


async def test_a_failing_write_is_undone_alone(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path / "q.db")
    epoch = await store.claim_partition(0)

    def half_then_fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO partition_owner VALUES (99, 1)")
        raise RuntimeError("boom")

    ok_before, failing, ok_after = await asyncio.gather(
        store.append("t", "a#1", [_item(1)], 0, epoch, 0, True),
        store.group.run(half_then_fail),
        store.append("t", "b#1", [_item(2)], 0, epoch, 0, True),
        return_exceptions=True,
    )
    assert isinstance(failing, RuntimeError)
    assert ok_before.outcomes == ok_after.outcomes == [AppendOutcome.OK]  # type: ignore[union-attr]
    await store.close()
    with sqlite3.connect(tmp_path / "q.db") as db:
        assert (
            db.execute("SELECT count(*) FROM partition_owner WHERE partition=99").fetchone()[0] == 0
        )
        assert db.execute("SELECT count(*) FROM queue_entries").fetchone()[0] == 2


async def test_a_failed_commit_fails_every_caller_of_its_turn(tmp_path: Path) -> None:
    """Another connection holds the write lock past the busy timeout: BEGIN fails, and every
    caller of that turn gets the error instead of a promise the disk did not keep."""
    store = SqliteQueueStore(tmp_path / "q.db")
    epoch = await store.claim_partition(0)
    store.db.execute("PRAGMA busy_timeout=50")
    blocker = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        results = await asyncio.gather(
            *(store.append("t", f"c{i}#1", [_item(i)], 0, epoch, 0, True) for i in range(3)),
            return_exceptions=True,
        )
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert all(isinstance(r, sqlite3.OperationalError) for r in results)
    report = await store.append("t", "c0#1", [_item(0)], 0, epoch, 0, True)
    assert report.outcomes == [AppendOutcome.OK] and report.last_seq == 1
    await store.close()


@pytest.mark.parametrize("n", [1, 600])
async def test_every_caller_is_answered(tmp_path: Path, n: int) -> None:
    """A lone write, and more writes than one transaction takes (max_ops)."""
    store = SqliteQueueStore(tmp_path / "q.db")
    epoch = await store.claim_partition(0)
    reports = await asyncio.gather(
        *(store.append("t", "c#1", [_item(i)], 0, epoch, 0, True) for i in range(n))
    )
    assert sorted(r.last_seq for r in reports) == list(range(1, n + 1))
    await store.close()


def _commit_modes(store: SqliteQueueStore) -> list[str]:
    """Record the synchronous mode each COMMIT of the store's connection runs under."""
    modes: list[str] = []
    mode = ["default"]  # the connection's own setting

    def trace(sql: str) -> None:
        if sql.startswith("PRAGMA synchronous="):
            mode[0] = sql.split("=", 1)[1]
        elif sql == "COMMIT":
            modes.append(mode[0])

    store.db.set_trace_callback(trace)
    return modes


async def test_acks_alone_skip_the_fsync_but_never_an_append(tmp_path: Path) -> None:
    """An ack's loss on a power cut is a redelivery, so a turn of acks only commits without
    an fsync; any turn holding an append is fsynced (synchronous=FULL), also when acks share
    it; and the connection is back to FULL after each relaxed turn."""
    store = SqliteQueueStore(tmp_path / "q.db")
    epoch = await store.claim_partition(0)
    await store.append("t", "c#1", [_item(i) for i in range(4)], 0, epoch, 0, True)
    modes = _commit_modes(store)
    await store.ack("t", "c#1", 1)
    assert modes == ["NORMAL"]
    mode_after = store.db.execute("PRAGMA synchronous").fetchone()[0]
    await asyncio.gather(
        store.ack("t", "c#1", 2), store.append("t", "c#1", [_item(9)], 0, epoch, 0, True)
    )
    await store.append("t", "c#1", [_item(10)], 0, epoch, 0, True)
    assert modes[1:] and all(m in ("FULL", "default") for m in modes[1:])
    assert mode_after == 2  # FULL again once the relaxed turn committed
    await store.close()
    again = SqliteQueueStore(tmp_path / "q.db")  # the relaxed ack is committed all the same
    entries, st = await again.read("t", "c#1", 1, 10)
    assert st.acked_through == 2 and [e.seq for e in entries] == [3, 4, 5, 6]
    await again.close()


async def test_with_store_sync_normal_nothing_is_fsynced_per_commit(tmp_path: Path) -> None:
    store = SqliteQueueStore(tmp_path / "q.db", sync="normal")
    epoch = await store.claim_partition(0)
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    modes = _commit_modes(store)
    await store.append("t", "c#1", [_item(1)], 0, epoch, 0, True)
    await store.ack("t", "c#1", 1)
    assert modes == ["default", "default"]  # no switching: the connection stays NORMAL
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1
    await store.close()


async def test_the_wal_is_checkpointed_off_the_commit_path(tmp_path: Path) -> None:
    """Commits never checkpoint (a commit that did would copy and fsync megabytes before its
    callers hear back); the background thread copies the WAL into the database."""
    path = tmp_path / "q.db"
    store = SqliteQueueStore(path)
    assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    epoch = await store.claim_partition(0)
    size_before = path.stat().st_size
    big = [NewQueueItem(f"m{i}", 1, b"x" * 4000) for i in range(300)]
    await store.append("t", "c#1", big, 0, epoch, 0, True)
    await eventually(
        lambda: path.stat().st_size >= size_before + 1_000_000, 5, "the WAL checkpointed"
    )
    await store.close()
