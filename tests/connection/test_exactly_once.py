"""The QoS 2 journal of a node (services/connection/exactly_once.py): what a failed record
write does."""

from __future__ import annotations

import asyncio

import pytest

from services.common.store.ports import Qos2Change, Qos2Update
from services.connection.exactly_once import Qos2Journal

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
