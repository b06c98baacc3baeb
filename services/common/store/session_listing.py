"""Listing a tenant's offline persistent sessions by client id, a page at a time: the port
both session stores implement (sqlite_session.py; cassandra_session.py through
cassandra_session_index.py), read by the session service's admin API
(services/session/offline.py)."""

from __future__ import annotations

from typing import Protocol

from services.common.store.ports_session import SessionRecord


class SessionListing(Protocol):
    async def offline_sessions(
        self, tenant: str, *, after: str, prefix: str, limit: int
    ) -> list[SessionRecord]:
        """Up to `limit` of the tenant's disconnected sessions (ended ones left out) whose
        client id starts with `prefix` and sorts above `after`, in client-id order (by the
        code points' UTF-8 bytes)."""


def is_offline(rec: SessionRecord) -> bool:
    """A parked session: disconnected and not ended (`Sessions` writes an ended one as
    expiry 0, disconnected at 0)."""
    return not rec.connected and not (rec.expiry_interval_s == 0 and rec.disconnected_at_ms == 0)


def prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (None: no bound)."""
    while prefix:
        last = ord(prefix[-1])
        if last < 0x10FFFF:
            bump = last + 1
            if 0xD800 <= bump <= 0xDFFF:  # surrogates never occur in a client id
                bump = 0xE000
            return prefix[:-1] + chr(bump)
        prefix = prefix[:-1]
    return None
