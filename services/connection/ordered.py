"""Operations that must run one after another, in the order they were asked for.

NATS subscribe/unsubscribe, storing a persistent session's subscriptions and starting its
queue delivery all go through one `OrderedOps`: a SUBACK is written only after the operations
queued before it finished, and a resumed session's queue starts after its subscriptions are in
place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("starling.connection.ordered")

Op = Callable[[], Awaitable[None]]


class OrderedOps:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Op] = asyncio.Queue()

    def put(self, op: Op) -> None:
        self._queue.put_nowait(op)

    def empty(self) -> bool:
        return self._queue.empty()

    async def run(self) -> None:
        while True:
            op = await self._queue.get()
            try:
                await op()
            except Exception:
                log.exception("ordered_op_failed")
