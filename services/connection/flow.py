"""Back-pressure: stop reading from publishers while the node cannot keep up.

When the messages waiting for NATS, the mesh data NATS handed us but we have not delivered, or
the publishes waiting for the router pass a high-water mark, the node is `paused`: every
connection that publishes while paused stops being read (TCP pushes back on its client) until
all three are below their low-water marks. Only publishers are throttled, so subscribers keep
reading and their PUBACKs keep freeing inflight windows. Without this a QoS 0 flood starves
the NATS side and the node drops what it already accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.connection.conn import Conn

PUBLISH_HIGH = 1000  # messages waiting for NATS or for the router
PUBLISH_LOW = 200
INBOUND_HIGH_BYTES = 1 << 20  # mesh data received but not yet delivered
INBOUND_LOW_BYTES = 256 << 10
CHECK_EVERY = 256  # messages between checks of the (costlier) inbound backlog
RECHECK_S = 0.002


class FlowControl:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        mesh_backlog: Callable[[], int],
        inbound_backlog_bytes: Callable[[], int],
        routing_backlog: Callable[[], int],
    ) -> None:
        self._loop = loop
        self._mesh_backlog = mesh_backlog
        self._inbound_backlog_bytes = inbound_backlog_bytes
        self._routing_backlog = routing_backlog
        self.paused = False
        self._since_check = 0
        self._throttled: set[Conn] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def published(self, n: int, conn: Conn | None) -> None:
        """`conn` handed over `n` messages: check the marks now and then; throttle it if the
        node is saturated."""
        self._since_check += n
        if self._since_check >= CHECK_EVERY or self._mesh_backlog() > PUBLISH_HIGH:
            self._since_check = 0
            self._check()
        if self.paused and conn is not None and conn not in self._throttled:
            if conn.pause_reading():
                self._throttled.add(conn)

    def forget(self, conn: Conn) -> None:
        self._throttled.discard(conn)

    def _check(self) -> None:
        if not self.paused and (
            self._mesh_backlog() > PUBLISH_HIGH
            or self._inbound_backlog_bytes() > INBOUND_HIGH_BYTES
            or self._routing_backlog() > PUBLISH_HIGH
        ):
            self.paused = True
            self._loop.call_later(RECHECK_S, self._maybe_resume)

    def _maybe_resume(self) -> None:
        if (
            self._mesh_backlog() > PUBLISH_LOW
            or self._inbound_backlog_bytes() > INBOUND_LOW_BYTES
            or self._routing_backlog() > PUBLISH_LOW
        ):
            self._loop.call_later(RECHECK_S, self._maybe_resume)
            return
        self.paused = False
        throttled, self._throttled = self._throttled, set()
        for conn in throttled:
            conn.resume_reading()
