"""LimitsCopies: copies of tenants' limits, read through the quota service's client, for the
services that enforce count limits without asking per request: connection nodes (a tenant's
`max_subscriptions_per_client`, services/connection/quota.py and subscription_slots.py), the
router (retained messages and bytes, services/router/retaining.py) and the queue service
(`max_queue_depth`, services/queue/appending.py). Shared by them, so owned by none of them.

- `get(tenant)` answers at once from the copy: a `TenantLimits` shared by every holder of
  the tenant and updated in place, so a connection that took it at CONNECT sees a later
  change. A tenant never asked about is fetched in the background and has no limits until
  the answer comes (a few ms: the first requests of a tenant are not held up).
- `fetch(tenant)` awaits the first answer, and the answer under way after an announced
  change (a read, and one more if the change came during a read: at most twice the
  client's timeout), for paths that wait anyway (a retained publish, an append): a
  retained publish right after a limit change must meet the new limit, not the copy the
  announcement is replacing. If that read fails, the last answer stays in force.
- A change the quota service announces (`ctl.quota.limits`, payload the tenant) is fetched
  again at once; every copy is also re-read every `refresh_s`, so a lost announcement costs
  a delay only.
- With the quota service unreachable the last answer stays in force; a tenant never
  answered has no limits and is asked again after `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.tasks import TaskSet
from services.common.tenant_limits import Limits

log = logging.getLogger("starling.quota.copies")

RETRY_S = 1.0


class LimitsSource(Protocol):
    """Where the copies come from: the quota service's client (services/quota/client.py)."""

    async def get_limits(self, tenant: str) -> Limits: ...

    async def close(self) -> None: ...


class TenantLimits:
    """One tenant's limits as last known (0: none); `known` once the service answered."""

    __slots__ = ("again", "changing", "fetched_at", "known", "limits", "tenant")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.limits = Limits()
        self.known = False
        self.fetched_at = -1e18
        self.changing = False  # a change was announced and its answer is not in yet
        self.again = False  # announced while a read was under way: read once more after it

    @property
    def max_subscriptions_per_client(self) -> int:
        return self.limits.max_subscriptions_per_client


class LimitsCopies:
    def __init__(
        self,
        client: LimitsSource,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._refresh_s = refresh_s
        self._clock = clock
        self._tenants: dict[str, TenantLimits] = {}
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._tasks = TaskSet()
        self._loop: asyncio.Task[None] | None = None
        self._seen_ok = True
        self._stopped = False

    def get(self, tenant: str) -> TenantLimits:
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = TenantLimits(tenant)
            self._ask(t)
        elif not t.known and self._clock() - t.fetched_at >= RETRY_S:
            self._ask(t)
        return t

    async def fetch(self, tenant: str) -> TenantLimits:
        t = self.get(tenant)
        # Not for the periodic refresh: that would make every call wait (up to the client's
        # timeout with the quota service down) every refresh_s. At most two reads: the one
        # under way and the one a change announced during it asks for (changes that keep
        # coming do not hold the caller longer).
        for _ in range(2):
            asking = self._asking.get(tenant)
            if asking is None or (t.known and not t.changing):
                break
            await asyncio.shield(asking)
        return t

    def _ask(self, t: TenantLimits) -> None:
        if t.tenant in self._asking or self._stopped:
            return
        task = self._tasks.spawn(self._read(t), name="quota-limits")
        self._asking[t.tenant] = task

    async def _read(self, t: TenantLimits) -> None:
        try:
            limits = await self._client.get_limits(t.tenant)
        except Exception as exc:  # keep the last answer; a tenant never answered: no limits
            if self._seen_ok:
                log.warning("quota_limits_unavailable", extra={"error": type(exc).__name__})
            self._seen_ok = False
            t.fetched_at = self._clock()
        else:
            self._seen_ok = True
            if limits != t.limits:
                log.info("quota_limits", extra={"tenant": t.tenant, **dataclasses.asdict(limits)})
            t.limits, t.known, t.fetched_at = limits, True, self._clock()
        finally:
            self._asking.pop(t.tenant, None)
            if t.again:  # announced during this read, which may predate the change
                t.again = False
                self._ask(t)
            else:
                t.changing = False

    async def _on_change(self, msg: Msg) -> None:
        t = self._tenants.get(msg.data.decode())
        if t is not None:
            t.changing = True
            if t.tenant in self._asking:
                t.again = True
            else:
                self._ask(t)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            for t in list(self._tenants.values()):
                self._ask(t)

    async def start(self, nc: Client) -> None:
        await nc.subscribe(subjects.QUOTA_LIMITS_CHANGED, cb=self._on_change)
        self._loop = asyncio.create_task(self._refresh(), name="quota-limits-refresh")

    async def stop(self) -> None:
        self._stopped = True  # a read cancelled below asks for no other
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        await self._tasks.cancel()
        await self._client.close()
