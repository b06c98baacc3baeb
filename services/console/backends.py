"""The admin clients the console calls the other services with: one set per admin token
(the signed-in person's own, so each admin API checks the tenant a second time), kept for
the most recent `max_sets` tokens and closed when dropped. The console reaches the other
services only through these clients."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from services.metrics.client import MetricsAdminClient
from services.quota.client import QuotaAdminClient
from services.router.client import RouterAdminClient
from services.rules.admin_client import RulesAdminClient
from services.session.client import SessionAdminClient
from services.session.token_client import TokenAdminClient


@dataclass(frozen=True, slots=True, kw_only=True)
class Addresses:
    session: str
    router: str
    rules: str
    quota: str
    metrics: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminClients:
    session: SessionAdminClient
    router: RouterAdminClient
    rules: RulesAdminClient
    quota: QuotaAdminClient
    metrics: MetricsAdminClient
    tokens: TokenAdminClient

    async def close(self) -> None:
        for client in (self.session, self.router, self.rules, self.quota, self.metrics):
            await client.close()
        await self.tokens.close()


class Backends:
    def __init__(self, addresses: Addresses, max_sets: int = 64) -> None:
        self._addresses = addresses
        self._max = max_sets
        self._sets: OrderedDict[str, AdminClients] = OrderedDict()
        self._dropped: list[AdminClients] = []

    def clients(self, token: str) -> AdminClients:
        key = hashlib.sha256(token.encode()).hexdigest()
        found = self._sets.get(key)
        if found is None:
            a = self._addresses
            found = AdminClients(
                session=SessionAdminClient(a.session, token),
                router=RouterAdminClient(a.router, token),
                rules=RulesAdminClient(a.rules, token),
                quota=QuotaAdminClient(a.quota, token),
                metrics=MetricsAdminClient(a.metrics, token),
                tokens=TokenAdminClient(a.session, token),
            )
            self._sets[key] = found
            while len(self._sets) > self._max:
                self._dropped.append(self._sets.popitem(last=False)[1])
        self._sets.move_to_end(key)
        return found

    async def close_dropped(self) -> None:
        """Close the sets dropped since the last call (after the requests using them ended)."""
        dropped, self._dropped = self._dropped, []
        for clients in dropped:
            await clients.close()

    async def close(self) -> None:
        await self.close_dropped()
        for clients in self._sets.values():
            await clients.close()
        self._sets.clear()
