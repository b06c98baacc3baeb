"""A route table booted from the latest routing snapshot plus the log after its checkpoint
holds exactly what the subscriptions table holds: after compactions, with changes landing
while a compaction and a boot run, and with no snapshot at all (scan)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.route_table import RouteTable
from services.common.store.eventlog import bucket_of, position_at
from services.common.store.ports_session import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from services.router.boot import load_routes, replay
from services.router.compaction import compact
from services.router.snapshot import SnapshotFormatError, decode_tenant, encode_tenant

TENANTS = ("acme", "beta", "gamma")
FILTERS = ("a/b", "a/+", "a/#", "#", "+/x", "s/1/2/3", "$SYS/x", "", "a//b", "é/ü")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteSessionStore]:
    s = SqliteSessionStore(tmp_path / "sessions.db")
    yield s
    await s.close()


def _records(table: RouteTable) -> set[SubscriptionRecord]:
    return {r for t in table.tenants() for r in table.records(t)}


async def _scan(store: SqliteSessionStore) -> set[SubscriptionRecord]:
    return set(await store.all_subscriptions())


async def _change(store: SqliteSessionStore, rng: random.Random) -> None:
    """One random subscription change, as the router makes them."""
    t, c, i = rng.choice(TENANTS), f"c{rng.randrange(12)}", rng.randrange(1, 3)
    roll = rng.random()
    if roll < 0.6:
        subs = [
            SubscriptionRecord(
                t,
                c,
                i,
                f,
                rng.randrange(3),
                rng.random() < 0.3,
                rng.random() < 0.3,
                rng.randrange(3),
                rng.choice((0, 0, 1, 268_435_455)),
            )
            for f in rng.sample(FILTERS, rng.randrange(1, 4))
        ]
        await store.put_subscriptions(subs)
    elif roll < 0.9:
        await store.delete_subscriptions(t, c, i, rng.sample(FILTERS, rng.randrange(1, 3)))
    else:
        await store.drop_subscriptions(t, c, i)


async def test_snapshot_plus_tail_equals_a_full_scan(store: SqliteSessionStore) -> None:
    rng = random.Random(15)
    for _ in range(300):
        await _change(store, rng)
    first = await compact(store)
    for _ in range(200):
        await _change(store, rng)
    await compact(store)  # a second snapshot: the boot takes the latest
    tail = 0
    for _ in range(150):
        await _change(store, rng)
        tail += 1
    table = RouteTable()
    report = await load_routes(store, table)
    assert report.source == "snapshot" and report.checkpoint > first.manifest.checkpoint
    assert report.replayed >= tail  # only the changes after the checkpoint were replayed
    expected = await _scan(store)
    assert expected and _records(table) == expected
    # And it routes like a table built from the scan.
    scanned = RouteTable()
    for rec in expected:
        scanned.add(rec)
    for t in TENANTS:
        for topic in ("a/b", "a/x/y", "s/1/2/3", "$SYS/x", "q/x", "é/ü", "a//b"):
            got = sorted(table.targets(t, topic, 2, True, "c1"), key=repr)
            assert got == sorted(scanned.targets(t, topic, 2, True, "c1"), key=repr)


async def test_no_snapshot_boots_from_a_scan(store: SqliteSessionStore) -> None:
    rng = random.Random(7)
    for _ in range(100):
        await _change(store, rng)
    table = RouteTable()
    report = await load_routes(store, table)
    assert report.source == "scan" and report.replayed == 0
    assert _records(table) == await _scan(store)


async def test_exact_while_subscriptions_change_during_compaction_and_boot(
    store: SqliteSessionStore,
) -> None:
    rng = random.Random(99)
    for _ in range(200):
        await _change(store, rng)
    stop = asyncio.Event()
    progress = asyncio.Event()
    changes = 0

    async def writer() -> None:
        nonlocal changes
        while not stop.is_set():
            await _change(store, rng)
            changes += 1
            progress.set()

    async def until(n: int) -> None:
        while changes < n:
            progress.clear()
            await progress.wait()

    task = asyncio.create_task(writer())
    try:
        # Let changes flow, compact in the middle of them, then boot in the middle of them.
        await until(50)
        await compact(store)
        seen = changes
        await until(seen + 50)
        table = RouteTable()
        report = await load_routes(store, table)
        await until(seen + 100)  # and more after the boot read the tail
    finally:
        stop.set()
        await task
    assert report.source == "snapshot"
    # What a running router does next: take the changes after its position.
    await replay(store, table, report.position)
    assert _records(table) == await _scan(store)


async def test_compaction_prunes_the_log_up_to_the_checkpoint(
    store: SqliteSessionStore,
) -> None:
    now_bucket = bucket_of(position_at(int(time.time() * 1000)))
    # A row logged two hours ago (written as the store would have then).
    old = position_at((now_bucket - 2) * 3_600_000 + 5)
    store.db.execute(
        "INSERT INTO event_log VALUES ('acme', ?, ?, 'subscribed', 'c', 1, 'old', 1, x'')",
        (now_bucket - 2, old),
    )
    p = await store.put_subscriptions([SubscriptionRecord("acme", "c", 1, "new", 1)])
    report = await compact(store)
    # The embedded store prunes exactly what the snapshot holds (Cassandra: whole hours).
    assert report.pruned == 2
    assert await store.read_events(0, 100) == []
    assert await store.pruned_through("acme") == p


def test_snapshot_round_trips_every_option_and_rejects_damage() -> None:
    table = RouteTable()
    recs = {
        SubscriptionRecord("t", "c", 1, "a/#", 2, True, True, 2, 268_435_455),
        SubscriptionRecord("t", "c", 1, "", 0),
        SubscriptionRecord("t", "d", 9, "a/#", 1, False, False, 1, 0),
        SubscriptionRecord("t", "d", 9, "/", 1),
    }
    for r in recs:
        table.add(r)
    count, parts = encode_tenant(table, "t")
    assert count == len(recs)
    trie, sessions = decode_tenant("t", parts)
    loaded = RouteTable()
    loaded.adopt("t", trie, sessions)
    assert set(loaded.records("t")) == recs
    with pytest.raises(SnapshotFormatError):
        decode_tenant("t", [parts[0][:-3]])


async def test_a_snapshot_booted_table_takes_changes_like_a_scanned_one(
    store: SqliteSessionStore,
) -> None:
    """The sessions' filters of a snapshot-loaded tenant are made on first use: later
    unsubscribes and session drops (the router's changes) must still find them."""
    rng = random.Random(3)
    for _ in range(200):
        await _change(store, rng)
    await compact(store)
    booted, scanned = RouteTable(), RouteTable()
    assert (await load_routes(store, booted)).replayed == 0
    for rec in await store.all_subscriptions():
        scanned.add(rec)
    for t in TENANTS:
        for c in ("c1", "c2", "c3"):
            for table in (booted, scanned):
                table.drop(t, c, 1)
                table.remove(t, "c4", 2, "a/#")
                table.add(SubscriptionRecord(t, "c5", 1, "z/+", 1))
        assert booted.routes(t) == scanned.routes(t)
        for topic in ("a/b", "z/q", "s/1/2/3"):
            got = sorted(booted.targets(t, topic, 2, False, "x"), key=repr)
            assert got == sorted(scanned.targets(t, topic, 2, False, "x"), key=repr)
    assert _records(booted) == _records(scanned) and len(booted) == len(scanned)


async def test_an_unreadable_snapshot_boots_from_a_scan(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(5)
    for _ in range(100):
        await _change(store, rng)
    await compact(store)
    monkeypatch.setattr("services.router.snapshot.FORMAT", 99)  # as if written by a newer one
    table = RouteTable()
    report = await load_routes(store, table)
    assert report.source == "scan"
    assert _records(table) == await _scan(store)
