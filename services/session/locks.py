"""One asyncio lock per key, held only while someone uses it (the map never grows beyond the
keys in use).

The session service serialises a client id's CONNECT and DISCONNECT with it: a DISCONNECT
that set Session Expiry 0 must end the session before an immediate reconnect of the same
client decides whether a session is present. One lock per process: with several session
service instances the same order needs the registry's epochs (see Connect).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
