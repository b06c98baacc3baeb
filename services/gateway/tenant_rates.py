"""TenantRates: the gateway's share of each tenant's rate limits (`max_messages_per_s`,
`max_bytes_in_per_s`), leased from the quota service as a connection node leases them, so a
tenant's limit holds across nodes and gateways together.

Theory of operation: a budget per (tenant, resource) holds the tokens the quota service
granted this gateway for the current one-second window (`ttl_ms` says when it ends). A
publish takes what it needs from the tokens; when they do not cover it, one lease call at a
time per budget asks for the shortfall plus a slice of the limit (so a steady stream asks
about ten times a second, not once per message). A lease that grants less than needed
refuses the publish with the seconds left in the window (the HTTP answer's Retry-After); the
tokens it did grant stay for the next ones. A tenant without a limit (the answer's `limit`
0) is not asked again for `recheck_s`, or until `ctl.quota.limits` names it. The quota
service unreachable: publishes pass (`quota_unavailable` logged once per outage), as a
node's budgets fall back rather than stop every publisher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.quota.client import LeaseResult, QuotaClient

log = logging.getLogger("starling.gateway.rates")

MESSAGES = "messages_per_s"
BYTES_IN = "bytes_in_per_s"
SLICES = 10  # a lease asks for at least limit / SLICES beyond what it needs


@dataclass(slots=True)
class _Budget:
    lock: asyncio.Lock
    tokens: int = 0
    expires: float = 0.0  # monotonic end of the tokens' window
    limit: int = -1  # -1: not known yet; 0: unlimited
    unlimited_until: float = 0.0


class TenantRates:
    def __init__(
        self,
        *,
        quota: QuotaClient,
        node_id: str,
        recheck_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._quota = quota
        self._node_id = node_id
        self._recheck_s = recheck_s
        self._clock = clock
        self._budgets: dict[tuple[str, str], _Budget] = {}
        self._available = True

    def limits_changed(self, tenant: str) -> None:
        """The tenant's limits changed (`ctl.quota.limits`): ask again at its next publish."""
        for resource in (MESSAGES, BYTES_IN):
            b = self._budgets.get((tenant, resource))
            if b is not None:
                b.limit, b.unlimited_until = -1, 0.0

    async def take(self, tenant: str, messages: int, size: int) -> float | None:
        """Charge `messages` messages of `size` bytes to the tenant: None if its limits
        allow them, else the seconds until its next window (nothing is charged then)."""
        wait = await self._take(tenant, MESSAGES, messages)
        if wait is not None or not size:
            return wait
        wait = await self._take(tenant, BYTES_IN, size)
        if wait is not None:
            self._give_back(tenant, MESSAGES, messages)
        return wait

    def _give_back(self, tenant: str, resource: str, amount: int) -> None:
        b = self._budgets.get((tenant, resource))
        if b is not None and b.limit > 0 and self._clock() < b.expires:
            b.tokens += amount

    async def _take(self, tenant: str, resource: str, amount: int) -> float | None:
        b = self._budgets.get((tenant, resource))
        if b is None:
            b = self._budgets[(tenant, resource)] = _Budget(asyncio.Lock())
        if self._covered(b, amount):
            return None
        async with b.lock:  # one lease call at a time; those waiting look again after it
            if self._covered(b, amount):
                return None
            return await self._lease(tenant, resource, b, amount)

    def _covered(self, b: _Budget, amount: int) -> bool:
        now = self._clock()
        if b.limit == 0 and now < b.unlimited_until:
            return True
        if b.limit > 0 and now < b.expires and b.tokens >= amount:
            b.tokens -= amount
            return True
        return False

    async def _lease(self, tenant: str, resource: str, b: _Budget, amount: int) -> float | None:
        now = self._clock()
        if now >= b.expires:
            b.tokens = 0
        ask = amount - b.tokens + (max(1, b.limit // SLICES) if b.limit > 0 else 0)
        try:
            lease = await self._quota.acquire_lease(tenant, self._node_id, resource, ask)
        except Exception as exc:
            if self._available:
                log.warning("quota_unavailable", extra={"error": type(exc).__name__})
            self._available = False
            return None
        self._available = True
        now = self._clock()
        if lease.limit == 0 and lease.result != LeaseResult.EXCEED_LIMIT:
            b.limit, b.unlimited_until = 0, now + self._recheck_s
            return None
        b.limit = lease.limit
        b.expires = now + lease.ttl_ms / 1000
        b.tokens += lease.granted
        if b.tokens >= amount:
            b.tokens -= amount
            return None
        return max(0.001, lease.ttl_ms / 1000)
