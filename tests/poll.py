"""The one polling helper of the suite: wait for a condition instead of sleeping.

`wait_until` for synchronous tests, `eventually` inside an event loop. Both return the
condition's first truthy value and fail with `what` (or the condition's repr) on timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T], timeout_s: float = 15.0, what: str = "", every_s: float = 0.05
) -> T:
    """Call `check` until it returns a truthy value; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        time.sleep(every_s)


async def eventually(
    check: Callable[[], T], within_s: float = 15.0, what: str = "", every_s: float = 0.02
) -> T:
    """`wait_until` for async tests: polls without blocking the event loop."""
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what or check}")
        await asyncio.sleep(every_s)
