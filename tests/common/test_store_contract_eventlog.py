"""Contract of the event log and the routing snapshots (`EventLog`), for every backend (the
Cassandra run needs STARLING_TEST_CASSANDRA, see test_store_contract_queue)."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common.store.eventlog import (
    ROUTE_KINDS,
    STREAM_KINDS,
    EventKind,
    LogEvent,
    LoggedSessionStore,
    bucket_of,
    chained_prefix,
    next_position,
    position_at,
    position_ms,
    subscription_of,
)
from services.common.store.ports_session import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from tests.common.queue_stores import cassandra_store as _cassandra
from tests.simulation.test_sim_eventlog import Simulated


@pytest.fixture(params=["sqlite", "cassandra", "simulated"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LoggedSessionStore]:
    if request.param == "sqlite":
        s: Any = SqliteSessionStore(tmp_path / "s.db")
    elif request.param == "cassandra":
        s = _cassandra("s")
    else:
        s = Simulated()
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


async def test_prune_drops_nothing_above_before_and_says_how_far(
    store: LoggedSessionStore,
) -> None:
    """Pruning never takes an event above `before`, and `pruned_through` covers every route
    event it took (the embedded store takes exactly those at or below `before`, Cassandra
    whole hours): what a router compares its position with to find a gap."""
    t, other = _tenant(), _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    assert await store.pruned_through(t) == 0
    p = await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "x", 1)])
    q = await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "y", 1)])
    await store.prune_events(p)
    left = [e.position for e in await store.read_events(start, 10, tenant=t)]
    assert q in left
    mark = await store.pruned_through(t)
    assert all(pos > mark for pos in left)
    assert p in left or mark >= p
    if isinstance(store, SqliteSessionStore):
        assert (left, mark) == ([q], p)  # exactly what is at or below `before`
    next_hour = position_at((bucket_of(q) + 1) * 3_600_000)
    assert await store.prune_events(next_hour) >= 1
    assert await store.read_events(start, 10, tenant=t) == []
    assert await store.pruned_through(t) >= q
    assert await store.pruned_through() >= q  # of any tenant
    assert await store.pruned_through(other) == 0  # a tenant with nothing pruned


async def test_a_subscribe_past_the_batch_limit_is_stored_and_logged_whole(
    store: LoggedSessionStore,
) -> None:
    """A SUBSCRIBE of many long filters (about 120 KiB: Cassandra refuses a batch over 50
    KiB, the simulated cluster too) is written in several batches, every row logged."""
    t = _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    subs = [SubscriptionRecord(t, "big", 1, f"{i:04}/" + "x" * 400, 1) for i in range(300)]
    last = await store.put_subscriptions(subs)
    events = await store.read_events(start, 1000, tenant=t)
    assert [subscription_of(e) for e in events] == subs
    assert events[-1].position == last
    assert {s.topic_filter for s in await store.all_subscriptions()} >= {
        s.topic_filter for s in subs
    }


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


@pytest.fixture(params=["sqlite", "cassandra"])
async def two_writers(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[LoggedSessionStore, LoggedSessionStore]]:
    """Two stores as two routers open them: on SQLite the one file of the data dir, on
    Cassandra two connections (each its own writer id and head cache)."""
    if request.param == "sqlite":
        a: LoggedSessionStore = SqliteSessionStore(tmp_path / "s.db")
        b: LoggedSessionStore = SqliteSessionStore(tmp_path / "s.db")
    else:
        a, b = _cassandra("s"), _cassandra("s")
    yield a, b
    await a.close()
    await b.close()


async def _write(store: LoggedSessionStore, t: str, client: str, rounds: int) -> list[int]:
    """`rounds` subscriptions of `client`, every third one deleted again; their positions."""
    mine: list[int] = []
    for i in range(rounds):
        mine.append(await store.put_subscriptions([SubscriptionRecord(t, client, 1, f"f/{i}", 1)]))
        if i % 3 == 0:  # a change that must come after the one above in every order
            mine.append(await store.delete_subscriptions(t, client, 1, [f"f/{i}"]))
    return mine


async def _replay(
    store: LoggedSessionStore, t: str, after: int, done: asyncio.Event, seen: list[LogEvent]
) -> None:
    """Read `t`'s events after `after` into `seen` as they come, until `done` and caught up."""
    while True:
        finished = done.is_set()  # read once more after the writers ended
        events = await store.read_events(after, 7, tenant=t)  # small pages: many reads
        seen.extend(events)
        if events:
            after = events[-1].position
        elif finished:
            return
        else:
            await asyncio.sleep(0.001)


async def test_two_writers_and_a_reader_see_every_change_once_in_one_order(
    two_writers: tuple[LoggedSessionStore, LoggedSessionStore],
) -> None:
    """Two routers change one tenant's table at once while a third replays it as it goes:
    the replaying reader applies every change exactly once, in the one order every later
    reader sees too, and its table ends as the subscriptions table is."""
    a, b = two_writers
    t = _tenant()
    start = position_at(int(time.time() * 1000) - 1000)
    rounds = 25
    done = asyncio.Event()
    seen: list[LogEvent] = []
    reader = asyncio.create_task(_replay(a, t, start, done, seen))
    written = await asyncio.gather(_write(a, t, "x", rounds), _write(b, t, "y", rounds))
    done.set()
    await asyncio.wait_for(reader, 30)

    positions = [e.position for e in seen]
    assert len(positions) == len(set(positions)) == 2 * (rounds + len(range(0, rounds, 3)))
    assert positions == sorted(positions)
    assert sorted(positions) == sorted(written[0] + written[1])
    assert await a.read_events(start, 10_000, tenant=t) == seen  # every reader: one order
    table: dict[tuple[str, str], LogEvent] = {}
    for e in seen:
        if e.kind == EventKind.SUBSCRIBED:
            table[e.client_id, e.topic] = e
        else:
            table.pop((e.client_id, e.topic))  # an unsubscribe after its subscribe
    stored = {(s.client_id, s.topic_filter) for s in await b.all_subscriptions() if s.tenant == t}
    assert set(table) == stored and len(stored) == 2 * (rounds - len(range(0, rounds, 3)))


def _chain(*links: tuple[str, int, int | None]) -> list[tuple[LogEvent, int | None]]:
    return [(LogEvent(t, EventKind.SUBSCRIBED, position=p), prev) for t, p, prev in links]


def test_a_reader_waits_for_a_link_still_on_its_way() -> None:
    """The Cassandra reader's rule: a tenant's route events are applied along their chain;
    a missing link holds back what follows it until it lands or is settled as never
    coming (its writer died after taking the position)."""
    # Writer 1 took 20 after 10, writer 2 took 30 after 20 and landed first.
    ready, waiting = chained_prefix(_chain(("a", 10, 0), ("a", 30, 20)), 0, settled=5)
    assert [e.position for e in ready] == [10] and waiting
    ready, waiting = chained_prefix(_chain(("a", 10, 0), ("a", 20, 10), ("a", 30, 20)), 0, 5)
    assert [e.position for e in ready] == [10, 20, 30] and not waiting
    # The reader already holds 20: 30 follows on.
    ready, waiting = chained_prefix(_chain(("a", 30, 20)), 20, 5)
    assert [e.position for e in ready] == [30] and not waiting
    # 20 never lands and is settled: 30 is applied after 10.
    ready, waiting = chained_prefix(_chain(("a", 10, 0), ("a", 30, 20)), 0, settled=25)
    assert [e.position for e in ready] == [10, 30] and not waiting
    # Another tenant's chain and unchained rows (reports) are not held back before the gap.
    rows = _chain(("b", 12, 0), ("a", 15, 0), ("a", 40, 35), ("b", 45, 12))
    rows.insert(1, (LogEvent("a", EventKind.CONNECTED, position=13), None))
    ready, waiting = chained_prefix(rows, 0, settled=5)
    assert [e.position for e in ready] == [12, 13, 15] and waiting


def test_interleaved_writers_replay_to_one_order() -> None:
    """A model of several writers on Cassandra: positions taken by compare-and-set on the
    head, rows landing in any order, a reader polling with `chained_prefix`. Whatever the
    landing order, the reader applies each event once, in the order positions were taken."""
    rng = random.Random(7)
    for _ in range(200):
        taken: list[tuple[int, int]] = []  # (prev, position) in the order the head moved
        head = 0
        for _ in range(rng.randint(1, 12)):
            position = head + rng.randint(1, 5)
            taken.append((head, position))
            head = position
        landing = taken[:]
        rng.shuffle(landing)
        landed: list[tuple[int, int]] = []
        applied: list[int] = []
        after = 0
        while len(applied) < len(taken):
            if landing and rng.random() < 0.6:
                landed.append(landing.pop())
            rows = [
                (LogEvent("t", EventKind.SUBSCRIBED, position=p), prev)
                for prev, p in sorted(landed, key=lambda link: link[1])
                if p > after
            ]
            ready, _ = chained_prefix(rows, after, settled=0)  # nothing is given up
            applied += [e.position for e in ready]
            if ready:
                after = ready[-1].position
        assert applied == [p for _, p in taken]
