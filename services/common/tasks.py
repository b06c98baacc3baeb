"""Background tasks owned by an object: spawn, keep a reference, log a failure, wait on exit.

asyncio keeps only weak references to tasks, so a task nobody holds can vanish mid-flight, and
an exception in a task nobody awaits is reported only when it is garbage collected. `TaskSet`
holds every task it starts until it ends and logs what killed it, with the task's name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("starling.tasks")


class TaskSet:
    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        if name is not None:
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("task_failed", extra={"task": task.get_name()}, exc_info=task.exception())

    async def wait(self, timeout_s: float) -> None:
        """Let running tasks finish for at most `timeout_s` (shutdown)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.01, timeout_s))

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
