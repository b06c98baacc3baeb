"""Where a persistent delivery hears of new entries in its queue (`QueueNotices`): the
queue's notice subject on NATS and, when its reads and acks go over the queue link
(services/queue/link.py), the notices that push entries to its reader there. Owns both
subscriptions, from the delivery's start to its close."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from services.queue.client import Notice, QueueClient

log = logging.getLogger("starling.connection.persistence")


class QueueNotices:
    def __init__(
        self,
        *,
        queue: QueueClient,
        nc: Client,
        subject: str,
        reader: str,
        on_link: Callable[[Notice], None],
        on_nats: Callable[[Msg], Awaitable[None]],
    ) -> None:
        """`on_link`: a notice from the queue link; `on_nats`: one from `subject`."""
        self._queue = queue
        self._nc = nc
        self._subject = subject
        self._reader = reader
        self._on_link = on_link
        self._on_nats = on_nats
        self._sub: NatsSubscription | None = None

    async def start(self) -> None:
        self._queue.listen(self._reader, self._on_link)
        self._sub = await self._nc.subscribe(self._subject, cb=self._on_nats)

    async def stop(self) -> None:
        self._queue.unlisten(self._reader)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the NATS connection may be closing too
                log.debug("notice_unsubscribe_failed")
