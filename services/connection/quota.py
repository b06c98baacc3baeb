"""A node's leases of tenant and user rate budgets (services/connection/budget.py holds the
buckets): it tops up the buckets that ask, one request per bucket at a time, and acts on
limit changes the quota service announces (`ctl.quota.limits`: the tenant's buckets forget
their limit and ask again). Deliveries held for want of outbound tokens wait on their bucket:
each lease answer wakes them; one whose window is spent asks again when the next one starts.

When the quota service cannot be reached, `quota_unavailable` decides:
- "keep" (default): a bucket whose limit is known keeps granting itself, per one-second
  window, what the service granted this node in its last full window, at most its fair
  share: the limit divided by the nodes the service last counted for the budget (each lease
  says how many asked for it within the service's `share_horizon_s`). Grants of one window
  are uneven (first come, first served), so the last windows' grants alone could sum past
  the limit (two nodes once self-granted 301 msg/s of a 200 limit); the fair shares cannot.
  A budget never answered admits.
- "allow": every publish is admitted until the service answers again.
- "deny": publishes of limited (or not yet known) budgets are refused meanwhile.
A failed request is retried after `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Literal

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.limits_copies import LimitsCopies
from services.common.tasks import TaskSet
from services.connection.budget import (
    LIMITED,
    UNLIMITED,
    Bucket,
    DeliveryGate,
    PublishGate,
)
from services.connection.channel.hooks import NO_HOOKS, DeliveryHooks
from services.quota.client import QuotaClient

log = logging.getLogger("starling.connection.quota")

RESOURCES = ("messages_per_s", "bytes_in_per_s")
OUT = "bytes_out_per_s"
RETRY_S = 1.0
Unavailable = Literal["keep", "allow", "deny"]


class NodeQuota:
    def __init__(
        self,
        *,
        node_id: str,
        client: QuotaClient | None,
        on_refused: Callable[[str, str], None],
        unavailable: Unavailable = "keep",
        slices: int = 10,
        clock: Callable[[], float] = time.monotonic,
        limits: LimitsCopies | None = None,
    ) -> None:
        self._node_id = node_id
        # Copies of tenants' count limits (subscriptions per client), taken at CONNECT.
        self._limits = limits
        self._client = client
        self._on_refused = on_refused
        self._unavailable = unavailable
        self._slices = slices
        self._clock = clock
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        self._timed: set[Bucket] = set()  # spent buckets with waiters: asked at the window end
        self._tasks = TaskSet()
        self.available = True  # the last request reached the quota service

    def gate(self, tenant: str, user: str, hooks: DeliveryHooks = NO_HOOKS) -> PublishGate | None:
        """The budgets a connection of `user` in `tenant` publishes under, its deliveries'
        reaching it through `hooks` (None: no quota service configured)."""
        if self._client is None:
            return None
        scopes = [(tenant, "")]
        if user:
            scopes.append((tenant, user))
        pairs = tuple(
            (self._bucket((t, u, RESOURCES[0])), self._bucket((t, u, RESOURCES[1])))
            for t, u in scopes
        )
        limits = self._limits.get(tenant) if self._limits is not None else None
        out = tuple(self._bucket((t, u, OUT)) for t, u in scopes)
        delivery = DeliveryGate(
            tenant=tenant,
            buckets=out,
            clock=self._clock,
            on_refused=self._on_refused,
            wait=self._wait,
            hooks=hooks,
        )
        return PublishGate(
            tenant=tenant,
            buckets=pairs,
            clock=self._clock,
            on_refused=self._on_refused,
            limits=limits,
            delivery=delivery,
        )

    def _bucket(self, key: tuple[str, str, str]) -> Bucket:
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = Bucket(key, self._want)
        return b

    def _want(self, bucket: Bucket) -> None:
        bucket.asking = True
        self._tasks.spawn(self._lease(bucket), name="quota-lease")

    def _wait(self, b: Bucket) -> None:
        """A delivery gate waits on `b`: a lease must answer (the answer wakes it). One is
        under way, or this window's budget is spent: then ask when the next window starts."""
        if b.asking or b in self._timed:
            return
        self._timed.add(b)
        self._tasks.spawn(self._ask_at_window_end(b), name="quota-wait")

    async def _ask_at_window_end(self, b: Bucket) -> None:
        try:
            await asyncio.sleep(max(0.0, max(b.not_before, b.expires) - self._clock()))
        finally:
            self._timed.discard(b)
        if b.waiters and not b.asking:
            self._want(b)  # its answer wakes them

    def _wake(self, b: Bucket) -> None:
        waiters, b.waiters = b.waiters, []
        for gate in waiters:
            gate.waiting = False
            gate.wake()

    async def _lease(self, b: Bucket) -> None:
        tenant, user, resource = b.key
        try:
            sized = b.state == LIMITED  # the first ask (limit not known) is for 1 unit
            amount = b.ask_size(self._slices) if sized else 1
            assert self._client is not None
            try:
                lease = await self._client.acquire_lease(
                    tenant, self._node_id, resource, amount, user
                )
            except Exception as exc:
                if self.available:
                    log.warning("quota_unavailable", extra={"error": type(exc).__name__})
                self.available = False
                self._fallback(b)
                return
            self.available = True
            b.answered = True
            now = self._clock()
            b.demand = 0
            if b.fallback:  # self-granted tokens end with the service's first answer
                b.fallback, b.tokens, b.granted_window, b.expires = False, 0, 0, now
            if lease.limit == 0:
                self._set_state(b, UNLIMITED)
                b.set_limit(0)
                return
            if b.state != LIMITED or now >= b.expires:
                # A new window: what the last one granted is the share "keep" reuses.
                if b.state == LIMITED and b.granted_window:
                    b.keep_rate = b.granted_window
                # Lapsed tokens go, a debt (publishes on credit) is paid from this grant.
                b.tokens, b.granted_window = min(b.tokens, 0), 0
            self._set_state(b, LIMITED)
            b.set_limit(lease.limit, amount if sized else 0)
            b.share = lease.limit // lease.nodes if lease.nodes else lease.limit
            b.tokens += lease.granted
            b.granted_window += lease.granted
            b.keep_rate = max(b.keep_rate, b.granted_window)
            b.expires = now + lease.ttl_ms / 1000
            if not lease.granted:
                b.not_before = b.expires  # the window's budget is spent: ask in the next
        finally:
            b.asking = False
            if b.waiters:
                self._wake(b)

    @staticmethod
    def _set_state(b: Bucket, state: int) -> None:
        """A budget's state changes: the delivery gates on it attach when it stops being
        unlimited and may detach when it becomes so."""
        flips = (b.state == UNLIMITED) != (state == UNLIMITED)
        b.state = state
        if flips:
            for gate in list(b.gates):
                gate.refresh()

    def _fallback(self, b: Bucket) -> None:
        """The quota service did not answer: apply `quota_unavailable` for RETRY_S, then
        ask again (the tokens last a little longer, so the retry does not leave a gap)."""
        now = self._clock()
        b.fallback = True
        b.not_before = b.renew_at = now + RETRY_S
        b.expires = now + RETRY_S * 1.5
        mode = self._unavailable
        if not b.answered and mode != "deny":
            # No limit known: it stays UNKNOWN, which admits everything and asks again once
            # per RETRY_S. (Marked LIMITED with a self-grant instead, its second failed
            # retry took it for a budget of 0: every publish refused, on a tenant that may
            # have no limits at all.)
            return
        if mode == "allow":
            tokens = 1 << 62
        elif mode == "keep":
            tokens = min(b.keep_rate, b.share)
        else:
            tokens = 0
        if b.state != LIMITED:
            self._set_state(b, LIMITED)
            b.set_limit(max(b.limit, 1))
        # A debt (publishes on credit while the failed request was under way) is paid from
        # the self-grant, as from a lease: the node stays within its share per second.
        b.tokens = min(b.tokens, 0) + tokens

    def limits_changed(self, tenant: str) -> None:
        for key, b in self._buckets.items():
            if key[0] == tenant:
                unlimited = b.state == UNLIMITED
                b.reset()
                if unlimited:  # its delivery gates may be needed again
                    for gate in list(b.gates):
                        gate.refresh()
                if b.waiters:  # the limit may be gone: held deliveries try again
                    self._wake(b)

    async def on_limits_changed(self, msg: Msg) -> None:
        self.limits_changed(msg.data.decode())

    async def start(self, nc: Client) -> None:
        if self._client is not None:
            await nc.subscribe(subjects.QUOTA_LIMITS_CHANGED, cb=self.on_limits_changed)
        if self._limits is not None:
            await self._limits.start(nc)

    async def stop(self) -> None:
        await self._tasks.cancel()
        if self._limits is not None:
            await self._limits.stop()
        if self._client is not None:
            await self._client.close()

    def refused(self) -> dict[tuple[str, str, str], int]:
        """Publishes refused per budget (tenant, user, resource) since the node started."""
        return {k: b.refused for k, b in self._buckets.items() if b.refused}


__all__ = ["UNLIMITED", "NodeQuota"]
