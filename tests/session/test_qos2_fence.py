"""Sessions.open on the embedded store: a clean start ends the session before it answers (a
persistent CONNECT right after never resumes it), and the QoS 2 fence a connection sets when it
opens a persistent session: above every earlier connection's even when its registry epoch is
lower (another session instance's clock was behind), and kept by the session's other writes,
so the changes an earlier connection still writes are ignored and the current one's are not."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from services.common import clock
from services.common.store.ports_session import InboundQos2, Qos2Change, Qos2Update
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.sessions import Sessions
from tests.poll import eventually


class _Unused:
    """Router, queues and events: resuming and disconnecting a session calls none of them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call: {name}")


async def test_a_later_connection_fences_off_an_earlier_one_whatever_its_epoch(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(tmp_path / "s.db")
    sessions = Sessions(
        store=store,
        router=_Unused(),  # type: ignore[arg-type]
        queues=_Unused(),  # type: ignore[arg-type]
        max_expiry_s=3600,
        events=_Unused(),  # type: ignore[arg-type]
    )
    try:
        first = await sessions.open("t", "c", False, 60, epoch=1_000)
        assert first.qos2_fence == 1_000

        def update(fence: int, change: str, pid: int, mid: str = "") -> Qos2Update:
            return Qos2Update("t", "c", first.incarnation, change, pid, mid, fence)

        await sessions.record_qos2([update(first.qos2_fence, Qos2Change.RECEIVED, 1, "m1")])
        await sessions.close("t", "c", first.incarnation, None)  # a normal disconnect
        # The client comes back through a session instance whose clock is behind: a lower
        # registry epoch, but the fence still goes above the first connection's.
        second = await sessions.open("t", "c", False, 60, epoch=400)
        assert second.present and second.incarnation == first.incarnation
        assert second.qos2_fence > first.qos2_fence
        assert second.awaiting_release == (InboundQos2(1, "m1"),)
        # The first connection's late writes are ignored; the second's are taken.
        await sessions.record_qos2(
            [
                update(first.qos2_fence, Qos2Change.RELEASED, 1),
                update(first.qos2_fence, Qos2Change.RECEIVED, 2, "late"),
            ]
        )
        await sessions.record_qos2([update(second.qos2_fence, Qos2Change.RECEIVED, 3, "m3")])
        await sessions.park("t", "c", int(time.time() * 1000))  # its node died: rewritten
        third = await sessions.open("t", "c", False, 60, epoch=2_000)
        assert third.awaiting_release == (InboundQos2(1, "m1"), InboundQos2(3, "m3"))
        assert third.qos2_fence > second.qos2_fence
    finally:
        await store.close()


class _SlowDiscard:
    """Router and queues whose drop of an ended session takes its time (a busy router)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.dropped: list[int] = []

    async def drop_session(self, tenant: str, client_id: str, incarnation: int) -> None:
        await self.release.wait()
        self.dropped.append(incarnation)

    async def drop(self, tenant: str, queue_id: str) -> None:
        await self.release.wait()


async def test_a_session_a_clean_connect_discards_is_never_resumed_while_it_is_discarded(
    tmp_path: Path,
) -> None:
    """[MQTT-3.1.2-6] A clean start ends the client id's session: a persistent CONNECT that
    comes before the discard is done gets Session Present 0 and a session of its own, not the
    ended one (whose subscriptions and queue the discard is deleting)."""
    store = SqliteSessionStore(tmp_path / "s.db")
    slow = _SlowDiscard()
    sessions = Sessions(store=store, router=slow, queues=slow, max_expiry_s=3600, events=_Unused())  # type: ignore[arg-type]
    try:
        first = await sessions.open("t", "c", False, 60, epoch=1)
        await sessions.close("t", "c", first.incarnation, None)
        clean = await sessions.open("t", "c", True, 0, epoch=2)  # clean, expiry 0
        assert not clean.present
        again = await sessions.open("t", "c", False, 60, epoch=3)  # discard still under way
        assert not again.present and again.incarnation not in (first.incarnation, 0)
        slow.release.set()
        await sessions.stop(5.0)
        assert first.incarnation in slow.dropped and again.incarnation not in slow.dropped
        rec = await store.get_session("t", "c")
        assert rec is not None and rec.incarnation == again.incarnation
    finally:
        await store.close()


class _Recorded:
    """Events: what the session service reports."""

    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, str]] = []

    async def emit(self, tenant: str, client_id: str, kind: str) -> None:
        self.emitted.append((tenant, client_id, kind))


class _DownThenUp:
    """A router away for the clean start's discard, back for the sweep."""

    def __init__(self) -> None:
        self.up = False

    async def drop_session(self, tenant: str, client_id: str, incarnation: int) -> None:
        if not self.up:
            raise ConnectionError("router away")

    async def drop(self, tenant: str, queue_id: str) -> None:
        return None


async def test_the_sweep_ends_what_a_clean_start_ended_without_calling_it_expired(
    tmp_path: Path,
) -> None:
    """The discard of a clean start failed (router away): the sweep ends that session later,
    and reports no `session_expired` for it; a session that did expire is reported once."""
    store = SqliteSessionStore(tmp_path / "s.db")
    router, events = _DownThenUp(), _Recorded()
    sessions = Sessions(store=store, router=router, queues=router, max_expiry_s=3600, events=events)  # type: ignore[arg-type]
    try:
        first = await sessions.open("t", "c", False, 60, epoch=1)
        await sessions.close("t", "c", first.incarnation, None)
        await sessions.open("t", "c", True, 0, epoch=2)  # its discard fails
        await sessions.stop(5.0)
        assert await store.get_session("t", "c") is not None  # left for the sweep
        short = await sessions.open("t", "d", False, 1, epoch=3)
        await sessions.close("t", "d", short.incarnation, None)
        router.up = True

        async def both_due() -> bool:  # a read only: "c" ended, "d" past its 1 s expiry
            return len(await store.expired_sessions(clock.now_ms())) == 2

        await eventually(both_due, 5, '"d" expired')
        assert await sessions.sweep() == 2
        assert await store.get_session("t", "c") is None
        assert await store.get_session("t", "d") is None
        assert events.emitted == [("t", "d", "session_expired")]
        assert await sessions.sweep() == 0
    finally:
        await store.close()
