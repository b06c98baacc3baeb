"""The node's pipeline to the router for QoS>=1 publishes.

Theory of operation: publishes wait in one FIFO; one task sends them in batches (everything
queued, up to MAX_BATCH) and, on the answer, releases their PUBACK/PUBREC in order. A
failed or TRY_LATER batch is retried with backoff and the same message ids, so a retry
after the router (or the queue) died cannot store a message twice. After `give_up_s` of
failures the publishers still waiting are disconnected without an ack; they resend after
reconnecting, which MQTT allows for unacknowledged QoS 1/2.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from services.router.client import RouteResult
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.connection.routing")

MAX_BATCH = 1000
_DONE = {RouteResult.STORED, RouteResult.NO_MATCH, RouteResult.QUOTA_EXCEEDED}

P = TypeVar("P")  # the publisher (a connection; None for wills and delayed releases)


class Router(Protocol):
    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]: ...


class RoutingPipeline(Generic[P]):
    def __init__(
        self,
        router: Router,
        on_done: Callable[[P | None, int, RouteResult], None],
        on_give_up: Callable[[P | None], None],
        give_up_s: float = 30.0,
    ) -> None:
        self._router = router
        self._on_done = on_done
        self._on_give_up = on_give_up
        self._give_up_s = give_up_s
        self._queue: deque[tuple[P | None, int, RoutedMessage]] = deque()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, publisher: P | None, pid: int, env: RoutedMessage) -> None:
        """Route `env`; `pid` is the publisher's packet id to acknowledge (0: none)."""
        self._queue.append((publisher, pid, env))
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                n = min(len(self._queue), MAX_BATCH)
                batch = [self._queue.popleft() for _ in range(n)]
                await self._route(batch)

    async def _route(self, batch: list[tuple[P | None, int, RoutedMessage]]) -> None:
        delay = 0.05
        started = time.monotonic()
        pending = batch
        while pending:
            try:
                results = await self._router.route([env for _, _, env in pending])
            except Exception as exc:  # router down or slow: retry the same messages
                log.warning("router_unavailable", extra={"error": type(exc).__name__})
                results = [RouteResult.TRY_LATER] * len(pending)
            retry = []
            for item, result in zip(pending, results, strict=True):
                if result in _DONE:
                    self._on_done(item[0], item[1], result)
                else:
                    retry.append(item)
            pending = retry
            if pending:
                if time.monotonic() - started > self._give_up_s:
                    log.error("router_gave_up", extra={"messages": len(pending)})
                    for conn, _, _ in pending:
                        self._on_give_up(conn)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
