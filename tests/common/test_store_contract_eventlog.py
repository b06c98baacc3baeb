"""Contract of the event log and the routing snapshots (`EventLog`), for every backend (the
Cassandra run needs STARLING_TEST_CASSANDRA, see test_store_contract_queue)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.eventlog import (
    ROUTE_KINDS,
    STREAM_KINDS,
    EventKind,
    LogEvent,
    LoggedSessionStore,
    bucket_of,
    next_position,
    position_at,
    position_ms,
    subscription_of,
)
from services.common.store.ports import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from tests.common.test_store_contract_queue import _cassandra


@pytest.fixture(params=["sqlite", "cassandra"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LoggedSessionStore]:
    s = SqliteSessionStore(tmp_path / "s.db") if request.param == "sqlite" else _cassandra("s")
    yield s
    await s.close()


def _tenant() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def test_positions_are_time_ordered_unique_and_bucketed() -> None:
    now = int(time.time() * 1000)
    p = next_position(0, now)
    assert position_ms(p) == now and bucket_of(p) == now // 3_600_000
    # The clock going back never makes a position at or below the last one.
    q = next_position(p, now - 5_000)
    assert q > p
    # Two writers in the same millisecond never collide (writer id in the low bits).
    assert next_position(0, now, 1) != next_position(0, now, 2)
    assert position_at(now + 1) > next_position(p, now, 5)


async def test_subscription_changes_are_logged_in_order(store: LoggedSessionStore) -> None:
    t = _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    a = SubscriptionRecord(t, "c", 3, "a/#", 1, True, False, 2, 268_435_455)
    b = SubscriptionRecord(t, "c", 3, "b/+", 2, False, True, 1, 0)
    p1 = await store.put_subscriptions([a, b])
    p2 = await store.delete_subscriptions(t, "c", 3, ["b/+"])
    p3 = await store.drop_subscriptions(t, "c", 3)
    assert 0 < p1 < p2 < p3
    events = await store.read_events(start, 100, tenant=t)
    assert [e.kind for e in events] == [
        EventKind.SUBSCRIBED,
        EventKind.SUBSCRIBED,
        EventKind.UNSUBSCRIBED,
        EventKind.SESSION_DROPPED,
    ]
    assert [e.position for e in events] == sorted({e.position for e in events})
    assert events[-1].position == p3
    # Every option survives the log (the subscription identifier at its maximum too).
    assert [subscription_of(e) for e in events[:2]] == [a, b]
    assert (events[2].topic, events[3].client_id, events[3].incarnation) == ("b/+", "c", 3)
    # Reading after a position, and across tenants, sees the same rows.
    later = await store.read_events(p1, 100, tenant=t)
    assert [e.position for e in later] == [p2, p3]
    everyone = [e for e in await store.read_events(start, 10_000) if e.tenant == t]
    assert everyone == events


async def test_stream_events_are_kept_apart_from_route_events(store: LoggedSessionStore) -> None:
    t = _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "x", 1)])
    last = await store.append_events(
        [
            LogEvent(t, EventKind.CONNECTED, "c", data=b"\x01"),
            LogEvent(t, EventKind.QUOTA_EXCEEDED, data=b"\x02"),
        ]
    )
    assert last > 0
    routes = await store.read_events(start, 100, tenant=t)
    assert [e.kind for e in routes] == [EventKind.SUBSCRIBED]
    stream = await store.read_events(start, 100, tenant=t, kinds=STREAM_KINDS)
    assert [(e.kind, e.data) for e in stream] == [
        (EventKind.CONNECTED, b"\x01"),
        (EventKind.QUOTA_EXCEEDED, b"\x02"),
    ]
    assert stream[-1].position == last
    both = await store.read_events(start, 100, tenant=t, kinds=ROUTE_KINDS | STREAM_KINDS)
    assert len(both) == 3


async def test_stable_position_covers_what_was_logged(store: LoggedSessionStore) -> None:
    t = _tenant()
    p = await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "x", 1)])
    stable = await store.stable_position()
    if isinstance(store, SqliteSessionStore):
        assert stable == p  # one writer at a time: everything committed is stable
    else:
        assert stable < p  # writes still in flight may land below now


async def test_prune_drops_only_whole_hours_before(store: LoggedSessionStore) -> None:
    t = _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    p = await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "x", 1)])
    await store.prune_events(p)  # the hour of p is not wholly before p: kept
    assert len(await store.read_events(start, 10, tenant=t)) == 1
    next_hour = position_at((bucket_of(p) + 1) * 3_600_000)
    assert await store.prune_events(next_hour) >= 1
    assert await store.read_events(start, 10, tenant=t) == []


async def test_snapshots_latest_wins_and_old_ones_go(store: LoggedSessionStore) -> None:
    first = await store.put_snapshot(10, {"a": (2, [b"p0", b"p1"]), "b": (1, [b"q"])})
    second = await store.put_snapshot(20, {"a": (1, [b"r"])})
    assert second.snapshot_id > first.snapshot_id
    latest = await store.latest_snapshot()
    assert latest is not None
    assert (latest.snapshot_id, latest.checkpoint) == (second.snapshot_id, 20)
    assert latest.tenants == {"a": (1, 1)} and latest.subscriptions == 1
    assert await store.snapshot_parts(second.snapshot_id, "a") == [b"r"]
    assert await store.snapshot_parts(first.snapshot_id, "a") == [b"p0", b"p1"]  # kept: 2
    third = await store.put_snapshot(30, {})
    assert await store.snapshot_parts(first.snapshot_id, "a") == []  # the oldest went
    latest = await store.latest_snapshot()
    assert latest is not None and latest.snapshot_id == third.snapshot_id


async def test_sqlite_failed_snapshot_leaves_the_previous_in_force(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.db")
    try:
        good = await store.put_snapshot(10, {"a": (1, [b"ok"])})
        with pytest.raises(sqlite3.IntegrityError):
            # A part that cannot be written half-way through: nothing of it stays.
            await store.put_snapshot(20, {"a": (1, [b"x"]), "b": (1, [None])})  # type: ignore[list-item]
        latest = await store.latest_snapshot()
        assert latest is not None and latest.snapshot_id == good.snapshot_id
        assert latest.tenants == {"a": (1, 1)}
    finally:
        await store.close()


async def test_sqlite_subscription_and_log_row_commit_together(tmp_path: Path) -> None:
    """A subscription write whose log row cannot be written is not kept either."""
    store = SqliteSessionStore(tmp_path / "s.db")
    try:
        # Make the log refuse rows the way a full disk would make the commit fail.
        store.db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON event_log "
            "BEGIN SELECT RAISE(ABORT, 'log refused'); END"
        )
        with pytest.raises(sqlite3.IntegrityError):
            await store.put_subscriptions([SubscriptionRecord("t", "c", 1, "x", 1)])
        assert await store.all_subscriptions() == []
        store.db.execute("DROP TRIGGER refuse")
        await store.put_subscriptions([SubscriptionRecord("t", "c", 1, "x", 1)])
        assert len(await store.read_events(0, 10)) == 1
    finally:
        await store.close()
