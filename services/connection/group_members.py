"""The clean-session members of durable shared groups on this node: one GroupDeliveries
(group_delivery.py, `scan` mode) per such connection, made at its first shared subscription
at QoS >= 1 and closed with its last. A persistent session's is its PersistentDelivery's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from services.common.tasks import TaskSet
from services.connection.conn import Conn
from services.connection.group_delivery import GroupDeliveries
from services.connection.subscriptions import SharedGroup
from services.queue.client import QueueClient


class CleanGroupMembers:
    def __init__(self, *, queue: QueueClient, nc: object, wrote: Callable[[Conn], None]) -> None:
        """`wrote(conn)`: the connection has bytes to send."""
        self._queue = queue
        self._nc = nc
        self._wrote = wrote
        self._tasks = TaskSet()
        self._by_conn: dict[Conn, GroupDeliveries] = {}

    def join(
        self,
        conn: Conn,
        queue_id: str,
        member: tuple[int, tuple[int, ...]],
        shared: SharedGroup[Any] | None,
        durable: bool,
    ) -> None:
        """`conn` (a clean session) reads `queue_id` while the group is `durable`; `member`:
        its subscription's (QoS, subscription identifiers)."""
        d = self._by_conn.get(conn)
        if d is None:
            ch = conn.channel
            d = self._by_conn[conn] = GroupDeliveries(
                channel=ch,
                queue=self._queue,
                nc=self._nc,
                tenant=ch.tenant,
                now=time.time,
                wrote=lambda: self._wrote(conn),
                taken=(),
                scan=True,
            )
            d.start()
        d.join(queue_id, member[0], member[1], shared, durable)

    def leave(self, conn: Conn, queue_id: str) -> None:
        d = self._by_conn.get(conn)
        if d is None:
            return
        d.leave(queue_id)
        if not d.groups:
            del self._by_conn[conn]
            self._tasks.spawn(d.close(), name="group-members-close")
