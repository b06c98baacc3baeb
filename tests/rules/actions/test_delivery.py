"""Delivery semantics that hold for every action: a permanent failure is not retried, a
closed delivery fails what it still holds (so the source stays unacknowledged), a failing
dead-letter store surfaces as an error rather than an acknowledgement, and greedy batching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from services.rules.actions.base import Output, PermanentActionError
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, DeliveryClosedError, RetryPolicy
from tests.poll import eventually
from tests.rules.actions.helpers import output

FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02, max_retry_s=10)


class Scripted:
    """An action whose sends fail as scripted and which records what it sent."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = failures or []
        self.sent: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.closed = False

    async def start(self) -> None:
        pass

    async def send(self, outputs: Sequence[Output]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append([o.message_id for o in outputs])

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


async def test_permanent_failure_is_not_retried(store: SqliteDeadLetters) -> None:
    action = Scripted([PermanentActionError("rejected")])
    d = Delivery(action, "t1", "r1", store, FAST)
    await d.start()
    outcome = await d.deliver([output(1)])
    assert (outcome.delivered, outcome.attempts) == (False, 1)
    assert d.stats.retries == 0 and d.stats.dead_lettered == 1
    await d.close()


async def test_transient_failures_retry_until_sent(store: SqliteDeadLetters) -> None:
    action = Scripted([ConnectionError("a"), TimeoutError()])
    d = Delivery(action, "t1", "r1", store, FAST)
    await d.start()
    outcome = await d.deliver([output(1)])
    assert (outcome.delivered, outcome.attempts) == (True, 3)
    assert action.sent == [["m1"]] and d.stats.retries == 2
    assert (await store.stats("t1", "r1")).count == 0
    await d.close()


async def test_queued_outputs_go_out_together(store: SqliteDeadLetters) -> None:
    action = Scripted()
    action.gate = asyncio.Event()
    d = Delivery(action, "t1", "r1", store, FAST)
    await d.start()
    first = asyncio.create_task(d.deliver([output(0)]))
    await eventually(lambda: d.held == 1)
    rest = [asyncio.create_task(d.deliver([output(i)])) for i in range(1, 6)]
    await eventually(lambda: d.held == 6)
    action.gate.set()
    await asyncio.gather(first, *rest)
    assert action.sent == [["m0"], ["m1", "m2", "m3", "m4", "m5"]]
    await d.close()


async def test_close_fails_what_is_held_and_closes_the_action(store: SqliteDeadLetters) -> None:
    action = Scripted()
    action.gate = asyncio.Event()  # never set: the target hangs
    d = Delivery(action, "t1", "r1", store, FAST)
    await d.start()
    pending = [asyncio.create_task(d.deliver([output(i)])) for i in range(3)]
    await eventually(lambda: d.held == 3)
    await d.close(drain_s=0.1)
    for p in pending:
        with pytest.raises(DeliveryClosedError):
            await p
    assert action.closed
    assert (await store.stats("t1", "r1")).count == 0  # not dead letters: not acknowledged
    with pytest.raises(DeliveryClosedError):
        await d.deliver([output(9)])


async def test_a_failing_dead_letter_store_is_an_error_not_an_ack(tmp_path: Path) -> None:
    store = SqliteDeadLetters(tmp_path / "dl.db")
    await store.close()  # writes now fail
    d = Delivery(Scripted([PermanentActionError("no")]), "t1", "r1", store, FAST)
    await d.start()
    with pytest.raises(Exception) as info:
        await d.deliver([output(1)])
    assert not isinstance(info.value, DeliveryClosedError)
    assert d.held == 0
    await d.close()
