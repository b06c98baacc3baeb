"""The QoS 2 fence a connection sets when it opens a persistent session (Sessions.open, on
the embedded store): above every earlier connection's even when its registry epoch is lower
(another session instance's clock was behind), and kept by the session's other writes, so
the changes an earlier connection still writes are ignored and the current one's are not."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from services.common.store.ports import InboundQos2, Qos2Change, Qos2Update
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.sessions import Sessions


class _Unused:
    """Router, queues and events: resuming and disconnecting a session calls none of them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected call: {name}")


async def test_a_later_connection_fences_off_an_earlier_one_whatever_its_epoch(
    tmp_path: Path,
) -> None:
    store = SqliteSessionStore(tmp_path / "s.db")
    sessions = Sessions(store, _Unused(), _Unused(), 3600, _Unused())  # type: ignore[arg-type]
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
