"""The one polling helper of the suite: wait for a condition instead of sleeping.

`wait_until` for synchronous tests, `eventually` inside an event loop (its check may be a
coroutine function: each try is awaited). Both return the condition's first truthy value
and fail with `what` (or the condition's repr) on timeout; `what` may be a callable, asked
on failure only, to show what was last seen.
`holds_within` (and `holds_within_async` inside an event loop) answers True or False
instead of failing: to assert that something does not happen in a short window, or to let
a load settle before counting what arrived.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")
What = str | Callable[[], str]


def _first(check: Callable[[], T | None], timeout_s: float, every_s: float) -> T | None:
    """The check's first truthy value; None if none came in `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(every_s)


def _timed_out(timeout_s: float, what: What, check: object) -> AssertionError:
    said = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout_s} s waiting for {said or check}")


def wait_until(
    check: Callable[[], T | None], timeout_s: float = 15.0, what: What = "", every_s: float = 0.05
) -> T:
    """Call `check` until it returns a truthy value; AssertionError after `timeout_s`."""
    value = _first(check, timeout_s, every_s)
    if value is None:
        raise _timed_out(timeout_s, what, check)
    return value


def holds_within(check: Callable[[], object], timeout_s: float, every_s: float = 0.05) -> bool:
    """True as soon as `check` returns a truthy value, False if it did not in `timeout_s`."""
    return _first(check, timeout_s, every_s) is not None


async def _first_async(
    check: Callable[[], T | Awaitable[T | None] | None], within_s: float, every_s: float
) -> T | None:
    """`_first` inside an event loop; an awaitable answer is awaited."""
    deadline = time.monotonic() + within_s
    while True:
        answer = check()
        value: T | None = await answer if inspect.isawaitable(answer) else answer
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(every_s)


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    within_s: float = ...,
    what: What = ...,
    every_s: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None], within_s: float = ..., what: What = ..., every_s: float = ...
) -> T: ...


async def eventually(
    check: Callable[[], T | Awaitable[T | None] | None],
    within_s: float = 15.0,
    what: What = "",
    every_s: float = 0.02,
) -> T:
    """`wait_until` for async tests: polls without blocking the event loop. A check that
    returns an awaitable (an `async def`) is awaited on each try."""
    value = await _first_async(check, within_s, every_s)
    if value is None:
        raise _timed_out(within_s, what, check)
    return value


async def holds_within_async(
    check: Callable[[], object], within_s: float, every_s: float = 0.02
) -> bool:
    """`holds_within` inside an event loop (an awaitable answer is awaited)."""
    return await _first_async(check, within_s, every_s) is not None
