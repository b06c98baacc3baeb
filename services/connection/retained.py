"""Retained messages for new subscriptions, sent after the SUBACK.

By retain handling: 0 always [MQTT-3.3.1-9], 1 only for a subscription that did not exist
before [MQTT-3.3.1-10], 2 never [MQTT-3.3.1-11]; none for shared subscriptions. A live
session gets them straight from the router's answer; a persistent session has the router
append them to its queue, so they arrive in order with everything else queued for it.
"""

from __future__ import annotations

import logging
import time

from services.common.topics import NO_LIMITS, parse_shared
from services.connection.channel import SubscribeRequest
from services.connection.conn import Conn
from services.connection.writes import WriteBatcher
from services.router.client import RouterClient

log = logging.getLogger("starling.connection.retained")


class RetainedReplay:
    def __init__(self, router: RouterClient | None, writes: WriteBatcher) -> None:
        self._router = router
        self._writes = writes

    async def replay(self, conn: Conn, req: SubscribeRequest) -> None:
        if self._router is None or conn.closed:
            return
        fresh = req.fresh or (True,) * len(req.subscriptions)
        for (s, sub_id), is_new in zip(req.subscriptions, fresh, strict=True):
            if parse_shared(s.filter, NO_LIMITS) is not None or s.retain_handling == 2:
                continue
            if s.retain_handling == 1 and not is_new:
                continue
            try:
                await self._replay_one(conn, s.filter, s.qos, sub_id)
            except Exception as exc:
                log.warning("retained_lookup_failed", extra={"error": type(exc).__name__})

    async def _replay_one(
        self, conn: Conn, topic_filter: str, qos: int, sub_id: int | None
    ) -> None:
        assert self._router is not None
        ch = conn.channel
        if conn.persistent is not None:
            await self._router.queue_retained(
                ch.tenant, topic_filter, conn.persistent.queue_id, qos, sub_id
            )
            return
        found = await self._router.retained(ch.tenant, topic_filter)
        if conn.closed:
            return
        now = time.time()
        ids = (sub_id,) if sub_id else ()
        for m in found:
            ch.deliver(m, min(m.qos, qos), True, ids, now)  # [MQTT-3.3.1-8] retain flag set
        self._writes.mark(conn)
