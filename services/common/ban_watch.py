"""BanWatch: a copy of the ban list kept current for its holder (a session service checks it
at CONNECT, services/session/gatekeeper.py; a connection node kicks the clients it names,
services/connection/admission.py): read through the quota service's client at start and
every `sync_s`, and replaced at once by each change the service announces on NATS
(`ctl.quota.bans`, the whole list, decoded by the client). `on_change` runs after each
replacement.

If the quota service cannot be reached at start the holder starts anyway with what it has
(an empty list at first) and keeps trying every `sync_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bans import Ban, BanList
from services.common.bus import subjects

log = logging.getLogger("starling.quota.watch")


class BanSource(Protocol):
    """Where the list comes from: the quota service's client (services/quota/client.py)."""

    async def list_bans(self) -> list[Ban]: ...

    async def close(self) -> None: ...


class BanWatch:
    def __init__(
        self,
        *,
        client: BanSource,
        decode: Callable[[bytes], list[Ban]],
        sync_s: float,
        on_change: Callable[[BanList], None] | None = None,
    ) -> None:
        """`decode`: the whole list from an announcement's payload (the quota client's
        `bans_from_announcement`)."""
        self._client = client
        self._decode = decode
        self._sync_s = sync_s
        self._on_change = on_change
        self.bans = BanList()
        self._task: asyncio.Task[None] | None = None
        self._seen_ok = True
        self._announced = 0  # announcements applied: a sync older than one is stale

    def _replace(self, bans: list[Ban]) -> None:
        self.bans.replace(bans)
        if self._on_change is not None:
            self._on_change(self.bans)

    async def _on_announce(self, msg: Msg) -> None:
        try:
            bans = self._decode(msg.data)
        except Exception:
            log.warning("ban_announcement_unreadable")
            return
        self._announced += 1
        self._replace(bans)

    async def sync(self) -> bool:
        before = self._announced
        try:
            bans = await self._client.list_bans()
        except Exception as exc:
            if self._seen_ok:
                log.warning("ban_sync_failed", extra={"error": type(exc).__name__})
            self._seen_ok = False
            return False
        self._seen_ok = True
        if self._announced == before:  # else an announcement newer than this read came
            self._replace(bans)
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._sync_s)
            await self.sync()

    async def start(self, nc: Client) -> None:
        await nc.subscribe(subjects.QUOTA_BANS_CHANGED, cb=self._on_announce)
        await self.sync()
        self._task = asyncio.create_task(self._run(), name="ban-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._client.close()
