"""tests/poll.py, the suite's one polling helper: what its callers rely on."""

from __future__ import annotations

import asyncio

import pytest

from tests.poll import eventually, holds_within, holds_within_async, wait_until


def test_wait_until_returns_the_first_truthy_value_and_names_what_it_waited_for() -> None:
    answers = iter([0, [], "ready"])
    assert wait_until(lambda: next(answers), 1, every_s=0) == "ready"
    seen: list[int] = []
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for 3 seen: \[0"):
        wait_until(lambda: seen.append(0), 0.05, lambda: f"3 seen: {seen}", every_s=0.01)


def test_holds_within_answers_instead_of_failing() -> None:
    assert holds_within(lambda: True, 0.05)
    assert not holds_within(lambda: False, 0.05, every_s=0.01)


async def test_eventually_awaits_a_coroutine_check_on_each_try() -> None:
    tries: list[int] = []

    async def third_time() -> list[int]:
        await asyncio.sleep(0)
        tries.append(1)
        return tries if len(tries) == 3 else []

    assert await eventually(third_time, 1, every_s=0) == [1, 1, 1]

    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match="never"):
        await eventually(never, 0.05, "never")


async def test_holds_within_async_keeps_the_loop_running() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.02, flag.set)
    assert await holds_within_async(flag.is_set, 1)
    assert not await holds_within_async(lambda: asyncio.sleep(0, result=0), 0.05, every_s=0.01)
