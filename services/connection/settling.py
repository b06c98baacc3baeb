"""Ended connections whose last writes are still under way, by client (tenant, client id):
their QoS 2 records (services/connection/exactly_once.py) and a delayed will on its way to
the router (services/connection/wills.py). Owns which of those each ended client still
waits for.

The connection's release to the session service, and a takeover's kick reply, wait for
them (`release_when_settled`, `settled`), each wait at most `settle_s`: the next
connection, on any node, then resumes a session that knows every QoS 2 id this one took,
and its CONNECT finds the delayed will at the router to cancel or publish at once. A lost
dependency delays the release, never blocks it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.connection.exactly_once import ExactlyOnceInbound

Key = tuple[str, str]


class SettlingConnections:
    def __init__(self, settle_s: float) -> None:
        self._settle_s = settle_s
        self._records: dict[Key, ExactlyOnceInbound] = {}
        self._wills: dict[Key, asyncio.Task[None]] = {}

    def hold(self, key: Key, eo: ExactlyOnceInbound) -> None:
        """`eo`'s connection ended with records being written (before any kick reply)."""
        self._records[key] = eo

    def hold_will(self, key: Key, will: asyncio.Task[None]) -> None:
        """The connection of `key` ended with its delayed will on its way to the router
        (before any kick reply)."""
        self._wills[key] = will

        def forget(task: asyncio.Task[None]) -> None:
            if self._wills.get(key) is task:
                del self._wills[key]

        will.add_done_callback(forget)

    async def settled(self, tenant: str, client_id: str) -> None:
        """Before a takeover's kick is answered: this client's QoS 2 records are written
        and its delayed will is at the router."""
        key = (tenant, client_id)
        will = self._wills.get(key)
        if will is not None:
            await asyncio.wait((will,), timeout=self._settle_s)
        eo = self._records.get(key)
        if eo is not None:
            await eo.idle(self._settle_s)

    async def release_when_settled(
        self,
        key: Key,
        eo: ExactlyOnceInbound | None,
        closing: asyncio.Task[None] | None,
        release: Callable[[], None],
    ) -> None:
        """Call `release` once the connection's queue reader has detached (`closing`: so the
        queue pushes nothing more to it, and entries published after the client is seen
        gone reach its next connection as first attempts, DUP=0), its QoS 2 records (`eo`)
        are written and its delayed will (held under `key`) is at the router."""
        try:
            waits = [t for t in (closing, self._wills.get(key)) if t is not None]
            if waits:
                await asyncio.wait(waits, timeout=self._settle_s)
            if eo is not None and eo.busy:
                await eo.idle(self._settle_s)
        finally:
            if eo is not None and self._records.get(key) is eo:
                del self._records[key]
        release()
