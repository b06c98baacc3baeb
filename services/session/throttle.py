"""What authentication may cost: bounded password-hash work and back-off after failures.

- `HashGate`: at most N hash checks run at once (on a pool of N threads of their own, so a
  flood of logins never starves other thread work), at most M wait; beyond that the CONNECT is
  refused at once with 0x89 Server busy instead of queueing without bound.
- `Backoff`: failed logins counted per key (a user name, an IP address); after `threshold`
  failures the key is refused without any hash work for a period that doubles with every
  further failure (capped). A success clears the key. Memory is bounded (oldest keys dropped).
  State is per session-service instance.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class GateFullError(Exception):
    """Too many hash checks running and waiting: refuse with 0x89."""


class HashGate:
    def __init__(self, max_concurrent: int, max_queued: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="hash")
        self._limit = max_concurrent + max_queued
        self._sem = asyncio.Semaphore(max_concurrent)
        self.in_flight = 0  # running + waiting
        self.refused = 0

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the hash pool; `GateFullError` when the queue is full."""
        if self.in_flight >= self._limit:
            self.refused += 1
            raise GateFullError
        self.in_flight += 1
        try:
            async with self._sem:
                return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Backoff:
    """Failure counts per key with exponential back-off."""

    def __init__(
        self,
        *,
        threshold: int,
        base_s: float,
        max_s: float,
        window_s: float,
        max_keys: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._base_s = base_s
        self._max_s = max_s
        self._window_s = window_s
        self._max_keys = max_keys
        self._clock = clock
        # key -> (failures, time of the last failure, refused until)
        self._keys: OrderedDict[str, tuple[int, float, float]] = OrderedDict()

    def blocked_for(self, key: str) -> float:
        """Seconds this key is still refused (0: it may try)."""
        entry = self._keys.get(key)
        if entry is None:
            return 0.0
        return max(0.0, entry[2] - self._clock())

    def failed(self, key: str) -> None:
        now = self._clock()
        failures, last, _ = self._keys.pop(key, (0, now, 0.0))
        if now - last > self._window_s:
            failures = 0
        failures += 1
        until = 0.0
        if failures >= self._threshold:
            exponent = min(failures - self._threshold, 32)
            until = now + min(self._max_s, self._base_s * 2**exponent)
        self._keys[key] = (failures, now, until)
        while len(self._keys) > self._max_keys:
            self._keys.popitem(last=False)

    def succeeded(self, key: str) -> None:
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)


def peer_ip(peer_address: str) -> str:
    """The IP address of a node's peer string (`1.2.3.4:5678`, `::1:5678`, `ws:1.2.3.4`)."""
    address = peer_address.removeprefix("ws:")
    host, sep, port = address.rpartition(":")
    if sep and port.isdigit() and not peer_address.startswith("ws:"):
        return host
    return address


class AuthThrottle:
    """Back-off per user name and per IP address, as the session service applies it."""

    def __init__(self, by_user: Backoff, by_ip: Backoff) -> None:
        self._user = by_user
        self._ip = by_ip
        self.refused = 0

    def refused_now(self, user_key: str, peer_address: str) -> bool:
        ip = peer_ip(peer_address)
        if self._ip.blocked_for(ip) or (user_key and self._user.blocked_for(user_key)):
            self.refused += 1
            return True
        return False

    def failed(self, user_key: str, peer_address: str) -> None:
        self._ip.failed(peer_ip(peer_address))
        if user_key:
            self._user.failed(user_key)

    def succeeded(self, user_key: str) -> None:
        # Only the user's count: one valid account must not wash an address's failures.
        if user_key:
            self._user.succeeded(user_key)
