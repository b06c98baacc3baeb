"""In-process copies of users' credentials and tenants' ACLs, so a CONNECT reads neither
Redis nor the store while nothing changed.

Kept correct by invalidation, not by time alone: every change of a user or an ACL is announced
on `ctl.session.changed` (services/session/auth.py) and every session service instance drops
its copy when the announcement arrives (its own change drops it at once). A copy is also
dropped after `ttl_s`, which bounds how long an announcement lost with a NATS disconnect can
leave an instance behind. A read that began before a change must not store what it read after
the change was announced: `put` takes the generation `generation()` gave before the read and
stores nothing if a `forget` happened since. At most `max_entries` copies: past it, all go
(the next CONNECTs read them again).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Missing:
    """No copy (distinct from a cached None: "no such user")."""


MISSING = Missing()


class LocalCache(Generic[K, V]):
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._entries: dict[K, tuple[float, V]] = {}
        self._generation = 0

    @property
    def enabled(self) -> bool:
        return self._ttl > 0 and self._max > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | Missing:
        hit = self._entries.get(key)
        if hit is None:
            return MISSING
        if hit[0] <= time.monotonic():
            del self._entries[key]
            return MISSING
        return hit[1]

    def generation(self) -> int:
        return self._generation

    def put(self, key: K, value: V, generation: int) -> None:
        """Keep `value`, read after `generation()` returned `generation`, unless something
        was forgotten since (the value may predate that change)."""
        if not self.enabled or generation != self._generation:
            return
        if len(self._entries) >= self._max:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self._ttl, value)

    def forget(self, key: K | None = None) -> None:
        """Drop the copy of `key` (None: every copy)."""
        self._generation += 1
        if key is None:
            self._entries.clear()
        else:
            self._entries.pop(key, None)
