"""The QoS 2 journal of a node (services/connection/exactly_once.py): what a failed record
write does, and what a record written after its connection gave up waiting does."""

from __future__ import annotations

import asyncio

import pytest

from services.common.message import Message
from services.common.store.ports_session import Qos2Change, Qos2Update
from services.common.tasks import TaskSet
from services.connection.exactly_once import ExactlyOnceInbound, Qos2Journal

UPDATE = Qos2Update("t", "c", 1, Qos2Change.RECEIVED, 7, "m-7")


class FlakyRecorder:
    """The session service: refuses the first `failures` calls (it may have written them)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[list[Qos2Update]] = []

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        self.calls.append(list(updates))
        if self.failures:
            self.failures -= 1
            raise ConnectionError("session service restarting")


async def test_an_unconfirmed_record_is_written_again_before_the_publish_goes_on() -> None:
    # Giving up at once left a record of a message nobody published: its resend reached
    # persistent subscribers only, and a clean subscriber lost it.
    recorder = FlakyRecorder(failures=2)
    journal = Qos2Journal(recorder, give_up_s=5.0)
    runner = asyncio.ensure_future(journal.run())
    try:
        await asyncio.wait_for(journal.write([UPDATE]), 5.0)  # returns only once written
        assert recorder.calls == [[UPDATE]] * 3
        later = Qos2Update("t", "c", 1, Qos2Change.RELEASED, 7)
        await journal.write([later])  # later changes follow, in order
        assert recorder.calls[-1] == [later]
    finally:
        runner.cancel()


async def test_a_record_that_keeps_failing_fails_the_write_after_give_up() -> None:
    recorder = FlakyRecorder(failures=1000)
    journal = Qos2Journal(recorder, give_up_s=0.3)
    runner = asyncio.ensure_future(journal.run())
    try:
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(journal.write([UPDATE]), 5.0)
        assert len(recorder.calls) > 1  # retried before giving up
    finally:
        runner.cancel()


class GatedRecorder:
    """The session service, away until `gate` is set: then it writes what it was sent."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written: list[Qos2Update] = []

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        await self.gate.wait()
        self.written += updates


async def test_a_record_written_after_its_connection_gave_up_waiting_is_not_routed() -> None:
    # A node drained while the session service was away: the connection's release went ahead
    # after SETTLE_S without its records, the client resent the publish to another node
    # (which took it under a new id), and then the record landed here and this node routed
    # it too: every subscriber got it twice at QoS 2 (found by tests/faults/chaos.py).
    recorder = GatedRecorder()
    journal = Qos2Journal(recorder, give_up_s=30.0)
    runner = asyncio.ensure_future(journal.run())
    published: list[Message] = []
    tasks = TaskSet()
    ids = iter(range(1, 100))
    eo = ExactlyOnceInbound(
        tenant="t",
        client_id="c",
        incarnation=1,
        journal=journal,
        new_id=lambda: f"m-{next(ids)}",
        publish=published.extend,
        store_only=published.append,
        failed=lambda: None,
        tasks=tasks,
        fence=42,
    )
    try:
        eo.route([Message("t", "a/b", b"x", 2, False, packet_id=7)])
        assert eo.busy
        await eo.idle(0.05)  # the connection's end waits no longer
        recorder.gate.set()  # the session service is back: the record is written
        await asyncio.wait_for(eo.idle(5.0), 5.0)
        assert not eo.busy
        assert published == []  # the client resends it to its next connection
        # The late record names its connection: a session resumed since ignores it.
        assert [(u.packet_id, u.fence) for u in recorder.written] == [(7, 42)]
        eo.route([Message("t", "a/b", b"y", 1, False, packet_id=8)])
        assert published == []  # nothing more from a connection that was given up
    finally:
        runner.cancel()
        await tasks.wait(1.0)
