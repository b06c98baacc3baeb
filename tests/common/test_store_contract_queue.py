"""Contract of `SessionStore` and `QueueStore`, for every backend (see test_store_contract):
sessions, and a queue's appends, reads, acks, limits, marks and migrations. Owners and
concurrent writers: test_store_contract_queue_owners.py."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    QueueStore,
)
from services.common.store.ports_session import (
    NEVER_EXPIRES,
    SessionRecord,
    SessionStore,
    SubscriptionRecord,
)
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.sqlite_session import SqliteSessionStore
from tests.common import queue_stores
from tests.common.queue_stores import cassandra_store
from tests.common.queue_stores import items as _items

queues = queue_stores.queues  # the fixture: every queue store


@pytest.fixture(params=["sqlite", "cassandra"])
async def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s = SqliteSessionStore(tmp_path / "s.db") if request.param == "sqlite" else cassandra_store("s")
    yield s
    await s.close()


async def test_session_records_and_expiry(sessions: SessionStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    assert await sessions.get_session(t, "c") is None
    await sessions.put_session(SessionRecord(t, "c", 1, 60, True))
    assert (await sessions.get_session(t, "c")) == SessionRecord(t, "c", 1, 60, True, 0)
    await sessions.put_session(SessionRecord(t, "c", 1, 60, False, 1_000))
    await sessions.put_session(SessionRecord(t, "never", 1, NEVER_EXPIRES, False, 1_000))
    expired = [r for r in await sessions.expired_sessions(61_000) if r.tenant == t]
    assert [r.client_id for r in expired] == ["c"]
    assert [r for r in await sessions.expired_sessions(60_999) if r.tenant == t] == []
    assert await sessions.delete_session(t, "c", 2) is False  # other incarnation
    assert await sessions.delete_session(t, "c", 1) is True
    assert await sessions.get_session(t, "c") is None


async def test_session_owner_round_trips(sessions: SessionStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    for owner in ("alice", "", None):  # a user, anonymous, unknown
        await sessions.put_session(SessionRecord(t, "c", 1, 60, False, 1_000, owner))
        rec = await sessions.get_session(t, "c")
        assert rec is not None and rec.owner == owner
    await sessions.put_session(SessionRecord(t, "c", 1, 60, False, 1_000, "bob"))
    (expired,) = [r for r in await sessions.expired_sessions(61_000) if r.tenant == t]
    assert expired.owner == "bob"


async def test_sqlite_session_file_without_owners_gets_the_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE sessions (tenant TEXT NOT NULL, client_id TEXT NOT NULL, "
        "incarnation INTEGER NOT NULL, expiry_interval_s INTEGER NOT NULL, "
        "connected INTEGER NOT NULL, disconnected_at_ms INTEGER NOT NULL, "
        "expires_at_ms INTEGER, PRIMARY KEY (tenant, client_id));"
        "INSERT INTO sessions VALUES ('t', 'c', 1, 60, 1, 0, NULL);"
    )
    db.commit()
    db.close()

    store = SqliteSessionStore(path)
    try:
        assert await store.get_session("t", "c") == SessionRecord("t", "c", 1, 60, True, 0)
        await store.put_session(SessionRecord("t", "c", 1, 60, True, 0, "alice"))
        rec = await store.get_session("t", "c")
        assert rec is not None and rec.owner == "alice"
    finally:
        await store.close()


async def test_subscriptions(sessions: SessionStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    subs = [
        SubscriptionRecord(t, "c", 3, "a/#", 1, True, False, 2, 7),
        SubscriptionRecord(t, "c", 3, "b", 2),
    ]
    await sessions.put_subscriptions(subs)
    await sessions.put_subscriptions([SubscriptionRecord(t, "c", 4, "new", 0)])
    assert await sessions.list_subscriptions(t, "c", 3) == subs
    await sessions.delete_subscriptions(t, "c", 3, ["b"])
    assert await sessions.list_subscriptions(t, "c", 3) == subs[:1]
    assert {s.topic_filter for s in await sessions.all_subscriptions() if s.tenant == t} == {
        "a/#",
        "new",
    }
    await sessions.drop_subscriptions(t, "c", 3)
    assert await sessions.list_subscriptions(t, "c", 3) == []


async def test_append_read_ack_in_order(queues: QueueStore) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "client#1"
    epoch = await queues.claim_partition(7)
    res = await queues.append(t, q, _items(5), 7, epoch, 0, True)
    assert res.outcomes == [AppendOutcome.OK] * 5
    assert (res.last_seq, res.dropped) == (5, 0)
    entries, st = await queues.read(t, q, 1, 100)
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
    assert [e.data for e in entries] == [f"payload-{i}".encode() for i in range(5)]
    assert (st.last_seq, st.acked_through, st.depth) == (5, 0, 5)
    await queues.ack(t, q, 3)
    entries, st = await queues.read(t, q, 1, 100)
    assert [e.seq for e in entries] == [4, 5] and st.acked_through == 3 and st.depth == 2
    await queues.ack(t, q, 2)  # acks never go backwards
    assert (await queues.state(t, q)).acked_through == 3


async def test_append_is_idempotent_per_message_id(queues: QueueStore) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "c#1"
    epoch = await queues.claim_partition(1)
    await queues.append(t, q, _items(3), 1, epoch, 0, True)
    res = await queues.append(t, q, _items(4), 1, epoch, 0, True)  # retry plus one new
    assert res.outcomes == [AppendOutcome.DUPLICATE] * 3 + [AppendOutcome.OK]
    assert (await queues.state(t, q)).last_seq == 4


async def test_depth_limit_policies(queues: QueueStore) -> None:
    t = f"t{uuid.uuid4().hex[:6]}"
    epoch = await queues.claim_partition(2)
    old = await queues.append(t, "old#1", _items(5), 2, epoch, 3, True)  # drop oldest
    assert old.dropped == 2
    entries, st = await queues.read(t, "old#1", 1, 100)
    assert [e.data for e in entries] == [b"payload-2", b"payload-3", b"payload-4"]
    assert st.dropped == 2
    res = await queues.append(t, "new#1", _items(5), 2, epoch, 3, False)  # reject newest
    assert res.outcomes == [AppendOutcome.OK] * 3 + [AppendOutcome.FULL] * 2
    assert (res.last_seq, res.dropped) == (3, 2)
    entries, st = await queues.read(t, "new#1", 1, 100)
    assert [e.data for e in entries] == [b"payload-0", b"payload-1", b"payload-2"]
    assert st.dropped == 2


async def test_every_write_reports_its_depth_change_and_depths_lists_queues(
    queues: QueueStore,
) -> None:
    """What the queue service's per-tenant depth and byte totals are made of
    (services/queue/depths.py): each change adds up to the queue's own counters, and `depths`
    lists what is left. Each test entry's data is 9 bytes."""
    t = f"t{uuid.uuid4().hex[:6]}"
    epoch = await queues.claim_partition(4)

    def change(r: AppendReport) -> tuple[int, int]:
        return r.depth_change, r.bytes_change

    assert change(await queues.append(t, "a#1", _items(3), 4, epoch, 0, True)) == (3, 27)
    assert change(await queues.append(t, "a#1", _items(1), 4, epoch, 0, True)) == (0, 0)
    assert await queues.ack(t, "a#1", 2) == QueueChange(-2, -18)
    assert await queues.ack(t, "a#1", 2) == QueueChange()  # acked before: no change
    assert await queues.ack(t, "nobody#1", 3) == QueueChange()
    # At the depth limit: the oldest dropped for each new one, or the newest refused.
    assert change(await queues.append(t, "b#1", _items(3), 4, epoch, 2, True)) == (2, 18)
    # (Bytes: a stored entry dropped for room counts on Cassandra until an ack passes it.)
    assert (await queues.append(t, "b#1", _items(1, 3), 4, epoch, 2, True)).depth_change == 0
    assert change(await queues.append(t, "c#1", _items(4), 4, epoch, 2, False)) == (2, 18)
    mine = sorted(r[:3] for r in await queues.depths() if r[0] == t)
    assert mine == [(t, "a#1", 1), (t, "b#1", 2), (t, "c#1", 2)]
    assert (await queues.state(t, "c#1")).bytes == 18
    assert (await queues.drop(t, "b#1")).depth == -2
    assert await queues.drop(t, "b#1") == QueueChange()
    assert await queues.ack(t, "a#1", 3) == QueueChange(-1, -9)
    assert [r for r in await queues.depths() if r[0] == t] == [(t, "c#1", 2, 18)]


async def test_room_bytes_refuses_what_does_not_fit(queues: QueueStore) -> None:
    """The tenant's max_queued_bytes at the store: entries past the room are OVER_BYTES
    (not stored, no seq taken); a duplicate takes no room; the rest of the append goes."""
    t = f"t{uuid.uuid4().hex[:6]}"
    epoch = await queues.claim_partition(5)
    res = await queues.append(t, "r#1", _items(4), 5, epoch, 0, True, room_bytes=20)
    assert res.outcomes == [AppendOutcome.OK] * 2 + [AppendOutcome.OVER_BYTES] * 2
    assert (res.last_seq, res.depth_change, res.bytes_change, res.dropped) == (2, 2, 18, 0)
    res = await queues.append(t, "r#1", _items(3), 5, epoch, 0, True, room_bytes=9)
    assert res.outcomes == [AppendOutcome.DUPLICATE] * 2 + [AppendOutcome.OK]
    entries, st = await queues.read(t, "r#1", 1, 100)
    assert [e.data for e in entries] == [b"payload-0", b"payload-1", b"payload-2"]
    assert (st.depth, st.bytes) == (3, 27)
    assert await queues.ack(t, "r#1", 3) == QueueChange(-3, -27)


async def test_released_mark_and_drop(queues: QueueStore) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "c#2"
    epoch = await queues.claim_partition(3)
    await queues.append(t, q, _items(2), 3, epoch, 0, True)
    await queues.mark_released(t, q, 1)
    entries, _ = await queues.read(t, q, 1, 10)
    assert [e.released for e in entries] == [True, False]
    await queues.drop(t, q)
    entries, st = await queues.read(t, q, 1, 10)
    assert entries == [] and st.last_seq == 0


async def test_delivered_through_is_marked_by_delivery_reads_and_only_grows(
    queues: QueueStore,
) -> None:
    t, q = f"t{uuid.uuid4().hex[:6]}", "c#3"
    epoch = await queues.claim_partition(4)
    await queues.append(t, q, _items(5), 4, epoch, 0, True)
    entries, st = await queues.read(t, q, 1, 100)
    assert len(entries) == 5 and st.delivered_through == 0
    assert (await queues.state(t, q)).delivered_through == 0  # a plain read marks nothing
    entries, st = await queues.read(t, q, 1, 2, mark_delivered=True)
    assert [e.seq for e in entries] == [1, 2]
    assert st.delivered_through == 0  # the value from before this read
    assert (await queues.state(t, q)).delivered_through == 2
    # A new connection reads from the start again: the mark says 1 and 2 may have been sent,
    # and re-reading them never lowers it.
    entries, st = await queues.read(t, q, 1, 1, mark_delivered=True)
    assert [e.seq for e in entries] == [1] and st.delivered_through == 2
    assert (await queues.state(t, q)).delivered_through == 2
    entries, st = await queues.read(t, q, 2, 100, mark_delivered=True)
    assert [e.seq for e in entries] == [2, 3, 4, 5] and st.delivered_through == 2
    assert (await queues.state(t, q)).delivered_through == 5
    # Appends, acks and a read with nothing left keep it.
    await queues.append(t, q, _items(2, start=5), 4, epoch, 0, True)
    await queues.ack(t, q, 4)
    assert await queues.read(t, q, 8, 10, mark_delivered=True) == ([], await queues.state(t, q))
    st = await queues.state(t, q)
    assert (st.last_seq, st.acked_through, st.delivered_through) == (7, 4, 5)
    entries, st = await queues.read(t, q, 1, 100, mark_delivered=True)
    assert [e.seq for e in entries] == [5, 6, 7] and st.delivered_through == 5
    assert (await queues.state(t, q)).delivered_through == 7
    await queues.drop(t, q)
    assert (await queues.state(t, q)).delivered_through == 0


async def test_read_is_capped_by_bytes_but_always_moves_one_entry(queues: QueueStore) -> None:
    """A read stops before the entry that would pass `max_bytes`, yet returns the first entry
    however large (a big entry is never stuck), and marks delivered only what it returned."""
    t, q = f"t{uuid.uuid4().hex[:6]}", "c#9"
    epoch = await queues.claim_partition(5)
    sizes = [100, 100, 5000, 100, 100, 100]
    items = [NewQueueItem(f"b{i}", 1, bytes(n)) for i, n in enumerate(sizes)]
    await queues.append(t, q, items, 5, epoch, 0, True)
    entries, _ = await queues.read(t, q, 1, 100, mark_delivered=True, max_bytes=1000)
    assert [e.seq for e in entries] == [1, 2]
    assert (await queues.state(t, q)).delivered_through == 2
    entries, _ = await queues.read(t, q, 3, 100, mark_delivered=True, max_bytes=1000)
    assert [len(e.data) for e in entries] == [5000]  # larger than the cap: alone
    assert (await queues.state(t, q)).delivered_through == 3
    entries, _ = await queues.read(t, q, 4, 2, max_bytes=1000)
    assert [e.seq for e in entries] == [4, 5]  # the count limit still holds
    entries, _ = await queues.read(t, q, 1, 100)
    assert len(entries) == 6  # 0: no byte cap


async def test_queue_survives_reopen(tmp_path: Path) -> None:
    q1 = SqliteQueueStore(tmp_path / "q.db")
    e = await q1.claim_partition(0)
    await q1.append("t", "c#1", _items(3), 0, e, 0, True)
    await q1.close()
    q2 = SqliteQueueStore(tmp_path / "q.db")
    entries, _ = await q2.read("t", "c#1", 1, 2, mark_delivered=True)
    assert len(entries) == 2
    await q2.close()
    q3 = SqliteQueueStore(tmp_path / "q.db")  # the delivered mark is on disk too
    assert (await q3.state("t", "c#1")).delivered_through == 2
    await q3.close()


async def test_held_bytes_survive_reopen_and_a_database_from_before_them_is_migrated(
    tmp_path: Path,
) -> None:
    """Restart: the bytes are in queue_state, written with the depth. A queues.db from before
    the column gets it, summed from the entries not acked (each 9 bytes here)."""
    path = tmp_path / "q.db"
    q1 = SqliteQueueStore(path)
    e = await q1.claim_partition(0)
    await q1.append("t", "c#1", _items(4), 0, e, 0, True)
    await q1.ack("t", "c#1", 1)
    await q1.close()
    q2 = SqliteQueueStore(path)
    assert (await q2.state("t", "c#1")).bytes == 27
    await q2.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE queue_state DROP COLUMN bytes")
    q3 = SqliteQueueStore(path)
    assert ((await q3.state("t", "c#1")).depth, (await q3.state("t", "c#1")).bytes) == (3, 27)
    assert await q3.depths() == [("t", "c#1", 3, 27)]
    await q3.close()


async def test_a_database_from_before_delivered_through_is_migrated(tmp_path: Path) -> None:
    """An existing queues.db gets the column; what was queued then may have been sent (the
    old code sent it), so it counts as delivered: resent with DUP=1, never DUP=0."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            """CREATE TABLE queue_state (
              tenant TEXT NOT NULL, queue_id TEXT NOT NULL, last_seq INTEGER NOT NULL,
              acked_through INTEGER NOT NULL, depth INTEGER NOT NULL, dropped INTEGER NOT NULL,
              PRIMARY KEY (tenant, queue_id));
            INSERT INTO queue_state VALUES ('t', 'old#1', 9, 4, 5, 0);"""
        )
    store = SqliteQueueStore(path)
    assert await store.state("t", "old#1") == QueueState(9, 4, 5, 0, 9)
    epoch = await store.claim_partition(0)
    await store.append("t", "old#1", _items(1), 0, epoch, 0, True)  # the upsert still works
    assert await store.state("t", "old#1") == QueueState(10, 4, 6, 0, 9, 9)
    await store.close()
    again = SqliteQueueStore(path)  # opening a migrated database changes nothing
    assert (await again.state("t", "old#1")).delivered_through == 9
    await again.close()
