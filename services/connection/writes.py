"""Batched socket writes: a connection with bytes to send is marked dirty, and every dirty
connection is flushed once per event-loop turn, so a burst of deliveries to one client
becomes one `write` call instead of one per PUBLISH. A connection with `FLUSH_NOW_BYTES`
waiting is written at once: the transport then knows how much it holds and says when it is
congested, instead of the node growing an unbounded buffer within one turn.
"""

from __future__ import annotations

import asyncio
from typing import Final

from services.connection.conn import Conn

FLUSH_NOW_BYTES: Final = 64 << 10


class WriteBatcher:
    __slots__ = ("_dirty", "_loop", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._dirty: set[Conn] = set()
        self._scheduled = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def mark(self, conn: Conn) -> None:
        if conn.closed:
            return
        if len(conn.channel.out) >= FLUSH_NOW_BYTES:
            conn.flush()
            return
        self._dirty.add(conn)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def discard(self, conn: Conn) -> None:
        self._dirty.discard(conn)

    def _flush(self) -> None:
        self._scheduled = False
        dirty = self._dirty
        self._dirty = set()
        for conn in dirty:
            if not conn.closed:
                conn.flush()
