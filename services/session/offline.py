"""The tenant's offline persistent sessions as an administrator sees them: a page of parked
sessions (from the session store) with each one's queue depth (from the queue service), and
ending one by hand as its expiry would (`Sessions.discard_offline`). The admin servicer
(services/session/api.py) only translates to and from this module."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.common.store.ports_session import NEVER_EXPIRES, SessionRecord
from services.common.store.session_listing import SessionListing
from services.queue.client import QueueStats, queue_id

log = logging.getLogger("starling.session.offline")

DEFAULT_PAGE = 50
MAX_PAGE = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class OfflineSession:
    client_id: str
    owner: str
    incarnation: int
    disconnected_at_ms: int
    expires_at_ms: int  # 0: never
    queue_depth: int | None  # None: the queue service did not answer


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPage:
    sessions: tuple[OfflineSession, ...]
    next: str  # the cursor of the next page; "" on the last


QueueStatsOf = Callable[[str, str], Awaitable[QueueStats]]


@dataclass(frozen=True, slots=True, kw_only=True)
class OfflineSessions:
    """`listing`: the session store; `queue_stats(tenant, queue_id)`: the queue service's
    GetQueueStats; `discard(tenant, client_id)`: `Sessions.discard_offline`."""

    listing: SessionListing
    queue_stats: QueueStatsOf
    discard: Callable[[str, str], Awaitable[bool]]

    async def page(self, tenant: str, *, prefix: str, after: str, limit: int) -> SessionPage:
        """Up to `limit` (0: DEFAULT_PAGE; at most MAX_PAGE) parked sessions of the tenant
        whose client id starts with `prefix`, after the cursor `after`."""
        size = min(limit or DEFAULT_PAGE, MAX_PAGE)
        # One more than asked says whether a next page exists without another trip.
        found = await self.listing.offline_sessions(
            tenant, after=after, prefix=prefix, limit=size + 1
        )
        shown = found[:size]
        depths = await asyncio.gather(*(self._depth(r) for r in shown))
        sessions = tuple(_view(r, d) for r, d in zip(shown, depths, strict=True))
        more = len(found) > size
        return SessionPage(sessions=sessions, next=shown[-1].client_id if more else "")

    async def _depth(self, rec: SessionRecord) -> int | None:
        try:
            stats = await self.queue_stats(rec.tenant, queue_id(rec.client_id, rec.incarnation))
        except Exception as exc:  # the page still lists the session, depth unknown
            log.warning("queue_depth_unavailable", extra={"error": str(exc)})
            return None
        return stats.depth


def _view(rec: SessionRecord, depth: int | None) -> OfflineSession:
    expires = rec.expires_at_ms()
    return OfflineSession(
        client_id=rec.client_id,
        owner=rec.owner or "",
        incarnation=rec.incarnation,
        disconnected_at_ms=rec.disconnected_at_ms,
        expires_at_ms=0 if expires is None or rec.expiry_interval_s == NEVER_EXPIRES else expires,
        queue_depth=depth,
    )
