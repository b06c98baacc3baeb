"""PublishBatcher: the publishes of one event-loop turn go into the mesh as one call, so 64
HTTP requests in flight cost one router call and one NATS message per topic, not 64 of each.

Each caller still gets its own answer: when the shared call succeeds, every caller's
messages are kept; when it fails (the router did not keep one message, or could not be
reached), each caller's messages are published again on their own, so one request's
refused message fails that request only. The message ids stay the same on the second try,
so a queue that already appended one drops the repeat; a QoS 0 message of the failed call
that had already gone live (it does not wait for the router) may reach a subscriber twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from services.common.tasks import TaskSet
from starling.common.v1.message_pb2 import RoutedMessage

Publish = Callable[[Sequence[RoutedMessage]], Awaitable[None]]
_Pending = tuple[Sequence[RoutedMessage], "asyncio.Future[None]"]

MAX_MESSAGES = 1000  # messages in one shared call at most


class PublishBatcher:
    def __init__(self, *, publish: Publish, max_messages: int = MAX_MESSAGES) -> None:
        self._publish = publish
        self._max = max_messages
        self._pending: list[_Pending] = []
        self._scheduled = False
        self._tasks = TaskSet()

    async def publish(self, envs: Sequence[RoutedMessage]) -> None:
        """Returns once `envs` are published (kept, for those that must be); raises what a
        call of them alone raised."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[None] = loop.create_future()
        self._pending.append((envs, answer))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        await answer

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        group: list[_Pending] = []
        size = 0
        for entry in pending:
            if group and size + len(entry[0]) > self._max:
                self._tasks.spawn(self._send(group), "gateway-publish")
                group, size = [], 0
            group.append(entry)
            size += len(entry[0])
        if group:
            self._tasks.spawn(self._send(group), "gateway-publish")

    async def _send(self, group: list[_Pending]) -> None:
        if len(group) == 1:
            await self._alone(group[0])
            return
        try:
            await self._publish([env for envs, _ in group for env in envs])
        except Exception:
            await asyncio.gather(*(self._alone(entry) for entry in group))
            return
        for _, answer in group:
            if not answer.done():
                answer.set_result(None)

    async def _alone(self, entry: _Pending) -> None:
        envs, answer = entry
        try:
            await self._publish(envs)
        except Exception as exc:
            if not answer.done():
                answer.set_exception(exc)
            return
        if not answer.done():
            answer.set_result(None)

    async def close(self) -> None:
        await self._tasks.cancel()
