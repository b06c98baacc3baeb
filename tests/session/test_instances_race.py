"""Two session service instances on one store, one client id: CONNECTs and DISCONNECTs that
reach different instances at once (a quick reconnect, a takeover) decide from the record each
read. Every write is a compare-and-set against that record (`SessionStore.replace_session`),
so no interleaving resumes a session another instance ended, ends one another connection
resumed, or leaves a connected client's record parked (its expiry running)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from services.common.store.ports_session import SessionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.sessions import Sessions, StaleConnectError


class _Drops:
    """Router and queues: which incarnations were discarded."""

    def __init__(self) -> None:
        self.dropped: list[int] = []
        # Set: a drop waits for `go` after setting `entered` (a discard under way).
        self.entered: asyncio.Event | None = None
        self.go: asyncio.Event | None = None

    async def drop_session(self, tenant: str, client_id: str, incarnation: int) -> None:
        if self.entered is not None and self.go is not None:
            self.entered.set()
            await self.go.wait()
        self.dropped.append(incarnation)

    async def drop(self, tenant: str, queue_id: str) -> None:
        return None


class _Unused:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call: {name}")


class _Between(SqliteSessionStore):
    """A store that runs `hook` (another instance's work) just before its next
    `replace_session`: the interleaving that a read and its write leave open."""

    hook: Any = None

    async def replace_session(self, r: SessionRecord, expect: SessionRecord | None) -> bool:
        hook, self.hook = self.hook, None
        if hook is not None:
            await hook()
        return await super().replace_session(r, expect)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = _Between(tmp_path / "s.db")
    yield s
    await s.close()


def _instances(
    store: SqliteSessionStore, drops: _Drops, events: Any = None
) -> tuple[Sessions, Sessions]:
    def make() -> Sessions:
        return Sessions(
            store=store,
            router=drops,  # type: ignore[arg-type]
            queues=drops,  # type: ignore[arg-type]
            max_expiry_s=3600,
            events=events or _Unused(),  # type: ignore[arg-type]
        )

    return make(), make()


async def _parked(a: Sessions, expiry_s: int = 60) -> Any:
    """A persistent session of client "c" that its first connection (epoch 1) left."""
    first = await a.open("t", "c", False, expiry_s, epoch=1)
    await a.close("t", "c", first.incarnation, None, first.qos2_fence)
    return first


async def test_a_resume_decided_before_a_clean_start_ended_the_session_starts_a_new_one(
    store: _Between,
) -> None:
    drops = _Drops()
    a, b = _instances(store, drops)
    first = await _parked(a)
    seen = await b.read("t", "c")  # B decides to resume from this record...
    await a.open("t", "c", True, 0, epoch=2)  # ...while A's clean start ends the session
    resumed = await b.open("t", "c", False, 60, rec=seen, epoch=3)
    assert not resumed.present and resumed.incarnation != first.incarnation
    await a.stop(5.0)
    await b.stop(5.0)
    assert drops.dropped == [first.incarnation]  # A's discard took only the ended one
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.incarnation == resumed.incarnation and rec.connected


async def test_a_release_that_loses_the_race_to_a_resume_leaves_it_connected(
    store: _Between,
) -> None:
    drops = _Drops()
    a, b = _instances(store, drops)
    first = await a.open("t", "c", False, 60, epoch=1)
    # A reads the record to park it; before it writes, B resumes the session (epoch 2).
    second: list[Any] = []

    async def resume() -> None:
        second.append(await b.open("t", "c", False, 60, epoch=2))

    store.hook = resume
    await a.close("t", "c", first.incarnation, None, first.qos2_fence)
    assert second[0].present
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.connected and rec.qos2_fence == second[0].qos2_fence
    assert rec.expires_at_ms() is None  # no expiry clock for a connected client
    # A late release of the first connection, read after the resume: nothing either.
    await a.close("t", "c", first.incarnation, None, first.qos2_fence)
    assert await store.get_session("t", "c") == rec
    # The second connection's own release parks it.
    await b.close("t", "c", first.incarnation, None, second[0].qos2_fence)
    rec = await store.get_session("t", "c")
    assert rec is not None and not rec.connected and rec.expires_at_ms() is not None
    assert drops.dropped == []


async def test_a_connect_overtaken_by_a_later_one_is_stale(store: _Between) -> None:
    drops = _Drops()
    a, b = _instances(store, drops)
    # A read "no session" for its CONNECT (epoch 1); B's later CONNECT (epoch 5) opened one.
    registry = _Registry(5)
    await b.open("t", "c", False, 60, epoch=5, current=registry.current(5))
    with pytest.raises(StaleConnectError):
        await a.open("t", "c", False, 60, rec=None, epoch=1, current=registry.current(1))
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.qos2_fence == 5 and rec.connected
    await asyncio.sleep(0)


async def test_a_resume_decided_just_before_the_session_expired_starts_a_new_one(
    store: _Between,
) -> None:
    drops, events = _Drops(), _Reported()
    a, b = _instances(store, drops, events)
    first = await _parked(a, expiry_s=1)  # expires 1 s after it is parked
    seen = await b.read("t", "c")
    drops.entered, drops.go = asyncio.Event(), asyncio.Event()
    sweep: list[asyncio.Task[int]] = []

    async def expire_and_sweep() -> None:
        # Between B's decision (before the expiry) and its write: the session expires and the
        # sweep is in the middle of its discard (routes and queue going, record not yet).
        await asyncio.sleep(1.1)
        sweep.append(asyncio.create_task(a.sweep()))
        await drops.entered.wait()

    store.hook = expire_and_sweep
    resumed = await b.open("t", "c", False, 60, rec=seen, epoch=2)
    drops.go.set()
    await sweep[0]
    await b.stop(5.0)  # B found the ended record: its own discard of it, done again
    assert not resumed.present and resumed.incarnation != first.incarnation
    assert set(drops.dropped) == {first.incarnation}  # never the new session's
    assert events.kinds == ["session_expired"]  # reported once, by the sweep that ended it
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.incarnation == resumed.incarnation and rec.connected


class _Reported:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def emit(self, tenant: str, client_id: str, kind: str) -> None:
        self.kinds.append(kind)


async def test_the_release_of_a_connection_a_clean_start_displaced_does_not_revive_it(
    store: _Between,
) -> None:
    """A takeover by a clean start ended the session; the displaced MQTT 5 connection's
    DISCONNECT (Session Expiry 300) arrives after: the session stays ended, never resumable."""
    drops = _Drops()
    a, b = _instances(store, drops)
    first = await a.open("t", "c", False, 60, epoch=1)
    drops.entered, drops.go = asyncio.Event(), asyncio.Event()  # B's discard: under way
    await b.open("t", "c", True, 0, epoch=2)  # the clean start, while `first` is connected
    await a.close("t", "c", first.incarnation, 300, first.qos2_fence)
    again = await a.open("t", "c", False, 60, epoch=3)
    assert not again.present and again.incarnation != first.incarnation
    drops.go.set()
    await b.stop(5.0)
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.incarnation == again.incarnation


class _Registry:
    """The registry's answer to "is this CONNECT's entry still the installed one?"."""

    def __init__(self, installed: int) -> None:
        self.installed = installed

    def current(self, epoch: int) -> Any:
        async def holds() -> bool:
            return self.installed == epoch

        return holds


async def test_an_older_connect_that_reads_a_later_connections_record_is_stale(
    store: _Between,
) -> None:
    a, b = _instances(store, _Drops())
    await _parked(a)
    registry = _Registry(5)  # epoch 3 claimed, then epoch 5 displaced it and opened at B
    await b.open("t", "c", False, 60, epoch=5, current=registry.current(5))
    with pytest.raises(StaleConnectError):  # A reads afresh after its kick of a dead node
        await a.open("t", "c", False, 60, epoch=3, current=registry.current(3))
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.connected and rec.qos2_fence == 5


async def test_an_older_persistent_connect_after_a_later_clean_start_is_stale(
    store: _Between,
) -> None:
    drops = _Drops()
    a, b = _instances(store, drops)
    await _parked(a)
    seen = await a.read("t", "c")
    registry = _Registry(5)

    async def later_clean_start() -> None:
        await b.open("t", "c", True, 0, epoch=5, current=registry.current(5))

    store.hook = later_clean_start
    with pytest.raises(StaleConnectError):
        await a.open("t", "c", False, 60, rec=seen, epoch=3, current=registry.current(3))
    await b.stop(5.0)
    rec = await store.get_session("t", "c")
    assert rec is None or not rec.connected  # no persistent session after the clean start


async def test_a_displaced_connections_end_leaves_a_later_ones_session_connected(
    store: _Between,
) -> None:
    a, b = _instances(store, _Drops())
    await a.open("t", "c", False, 60, epoch=1)
    later = await b.open("t", "c", False, 60, epoch=9)  # the newest, connected at B
    await a.ended("t", "c", None, epoch=1)  # epoch 1's DISCONNECT, told late to A
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.connected and rec.qos2_fence == later.qos2_fence


async def test_a_dead_nodes_park_leaves_a_session_resumed_meanwhile_connected(
    store: _Between,
) -> None:
    a, b = _instances(store, _Drops())
    await a.open("t", "c", False, 60, epoch=1)
    resumed: list[Any] = []

    async def resume() -> None:  # the client is back on another node before the park writes
        resumed.append(await b.open("t", "c", False, 60, epoch=5))

    store.hook = resume
    await a.park("t", "c", 1_000, epoch=1)
    rec = await store.get_session("t", "c")
    assert rec is not None and rec.connected and rec.qos2_fence == resumed[0].qos2_fence
    await a.park("t", "c", 1_000, epoch=1)  # the same park, read after the resume: nothing
    assert await store.get_session("t", "c") == rec


async def test_two_sweeps_report_one_expiry_once(store: _Between) -> None:
    drops, events = _Drops(), _Reported()
    a, b = _instances(store, drops, events)
    await _parked(a, expiry_s=1)
    await asyncio.sleep(1.1)
    drops.entered, drops.go = asyncio.Event(), asyncio.Event()
    scan = store.expired_sessions
    scanned = await scan(10**15)  # B's scan sees the record before A ends it
    sweep_a = asyncio.create_task(a.sweep())
    await drops.entered.wait()  # A ended it and is discarding

    async def stale_scan(now_ms: int, limit: int = 1000) -> list[SessionRecord]:
        return scanned

    store.expired_sessions = stale_scan  # type: ignore[method-assign]
    sweep_b = asyncio.create_task(b.sweep())
    await asyncio.sleep(0.2)
    drops.go.set()
    await asyncio.gather(sweep_a, sweep_b)
    assert events.kinds == ["session_expired"]
