"""A connection node's copies of tenants' persistent route tables, and the stand-in for the
router that uses them: a QoS>=1 publish goes from the node straight to the queues its copy
chooses, instead of node -> router -> queue. One process and two NATS messages fewer on the
path of every persistent message, and a tenant without persistent subscribers has its
publishes confirmed by the queue service alone.

Why a copy that lags is still safe: services/router/fencing.py. The copy's version goes with
every append (even one of no entries: the answer confirms "no persistent subscriber" too);
a queue refuses it unless the router fenced exactly that version last, and the router fences
a new one before it changes the table and answers the SUBACK. A refused batch goes through
the router at once, and the copy reloads.

What still goes through the router: retained publishes (the router stores them), delayed
ones (`$delayed/` topics, wills with a delay), a tenant whose copy is not loaded yet, or has
more subscriptions than the node's budget (`route_copy_max_subscriptions`), and any batch a
queue refused or could not take (the router decides, e.g. "no match" while the queues are
down). Copies load on a tenant's first publish and follow the router's RouteChange events
(rt.routes.<tenant>); an event out of sequence drops the copy until the next publish.

A copy loads from the latest routing snapshot plus the tenant's route events logged after
its checkpoint, which the router reads from the store and passes on (services/router/
copies.py): no per-subscription work on the router, about 1 µs per subscription here.
Without a snapshot, the router sends every entry and they are added one by one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.common.bus import subjects
from services.common.route_table import RouteResult, RouteTable, plan, settle
from services.common.rpc.errors import ServiceError
from services.common.tasks import TaskSet
from services.common.topics.delayed import DELAYED_PREFIX
from services.queue.client import NewEntry, QueueClient, StaleRoutesError
from services.router.client import RouterClient, route_record
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1.router_pb2 import RouteChange

log = logging.getLogger("starling.connection.replica")

# A tenant over the budget, or whose snapshot failed, is asked again after this long.
RETRY_S = 30.0


@dataclass(slots=True)
class TenantCopy:
    version: int
    table: RouteTable
    include_qos0: bool


def _apply(copy: TenantCopy, ch: RouteChange) -> None:
    tenant = ch.tenant
    for e in ch.added:
        copy.table.add(route_record(tenant, e))
    for e in ch.removed:
        copy.table.remove(tenant, e.client_id, e.incarnation, e.subscription.topic_filter)
    for e in ch.dropped:
        copy.table.drop(tenant, e.client_id, e.incarnation)
    copy.version = ch.version


class RouteCopies:
    """The copies this node holds, at most `max_subscriptions` subscriptions over all."""

    def __init__(self, router: RouterClient, nc: Client, max_subscriptions: int) -> None:
        self._router = router
        self._nc = nc
        self._max = max_subscriptions
        self._copies: dict[str, TenantCopy] = {}
        self._loading: dict[str, list[RouteChange]] = {}  # changes seen while loading
        self._refused: dict[str, int] = {}  # a queue refused this version: say so
        self._not_before: dict[str, float] = {}  # too large, or the router failed
        self._tasks = TaskSet()
        self._sub: Subscription | None = None
        self.loads = 0  # snapshots taken (for tests)

    async def start(self) -> None:
        if self._max:
            self._sub = await self._nc.subscribe(subjects.ROUTE_CHANGES, cb=self._on_change)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the connection may be closing already
                log.debug("route_changes_unsubscribe_failed")
        await self._tasks.wait(1.0)

    def size(self) -> int:
        return sum(len(c.table) for c in self._copies.values())

    def get(self, tenant: str) -> TenantCopy | None:
        """The tenant's copy; None (and a load begins, if it may) when there is none."""
        copy = self._copies.get(tenant)
        if copy is None and self._max and tenant not in self._loading:
            if time.monotonic() >= self._not_before.get(tenant, 0.0):
                self._loading[tenant] = []
                self._tasks.spawn(self._load(tenant), name=f"route-copy:{tenant}")
        return copy

    def refused(self, tenant: str, version: int) -> None:
        """A queue refused an append chosen by the copy at `version`: drop it (the next
        publish loads it again, telling the router which version was refused)."""
        copy = self._copies.get(tenant)
        if copy is not None and copy.version == version:
            del self._copies[tenant]
        self._refused[tenant] = version

    async def _load(self, tenant: str) -> None:
        changes: list[RouteChange] = []
        try:
            budget = max(1, self._max - self.size())
            snap = await self._router.route_snapshot(tenant, budget, self._refused.pop(tenant, 0))
        except Exception as exc:  # the router is down: publishes go through it (and wait)
            log.warning("route_copy_failed", extra={"tenant": tenant, "error": repr(exc)})
            self._not_before[tenant] = time.monotonic() + RETRY_S
            return
        finally:
            changes = self._loading.pop(tenant, [])
        self.loads += 1
        if snap.too_large:
            self._not_before[tenant] = time.monotonic() + RETRY_S
            return
        copy = TenantCopy(snap.version, snap.table, snap.include_qos0)
        for ch in changes:
            if ch.version <= copy.version:
                continue  # already in the snapshot
            if ch.prev_version != copy.version:
                return  # a change was missed: no copy; the next publish loads again
            _apply(copy, ch)
        self._copies[tenant] = copy
        self._not_before.pop(tenant, None)

    async def _on_change(self, msg: Msg) -> None:
        try:
            ch = RouteChange.FromString(msg.data)
        except Exception:  # only the router may publish here (NATS permissions)
            log.warning("route_change_malformed")
            return
        pending = self._loading.get(ch.tenant)
        if pending is not None:
            pending.append(ch)
            return
        copy = self._copies.get(ch.tenant)
        if copy is None or ch.version <= copy.version:
            return
        if ch.prev_version != copy.version:
            del self._copies[ch.tenant]  # a change was missed
            return
        _apply(copy, ch)
        if self.size() > self._max:  # grew past the budget: the router serves this tenant
            del self._copies[ch.tenant]
            self._not_before[ch.tenant] = time.monotonic() + RETRY_S


class CopyRouter:
    """`route` as the router answers it, from the node's copies where it can (the
    RoutingPipeline's Router)."""

    def __init__(self, router: RouterClient, queues: QueueClient, copies: RouteCopies) -> None:
        self._router = router
        self._queues = queues
        self._copies = copies

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        results = [RouteResult.NO_MATCH] * len(messages)
        by_tenant: dict[str, list[int]] = {}
        indirect: set[str] = set()  # tenants with a message the router itself must keep
        for i, m in enumerate(messages):
            tenant = m.tenant
            idx = by_tenant.get(tenant)
            if idx is None:
                idx = by_tenant[tenant] = []
            idx.append(i)
            if m.retain or m.delay_s or m.topic.startswith(DELAYED_PREFIX):
                indirect.add(tenant)
        jobs = []
        via: list[int] = []
        for tenant, idx in by_tenant.items():
            copy = self._copies.get(tenant)
            if copy is not None and tenant not in indirect:
                jobs.append(self._straight(tenant, idx, copy, messages, results))
            else:
                via += idx
        if via:
            jobs.append(self._via_router(via, messages, results))
        if len(jobs) == 1:  # the usual case: no task (and loop turn) of its own for it
            await jobs[0]
        else:
            await asyncio.gather(*jobs)
        return results

    async def _straight(
        self,
        tenant: str,
        idx: list[int],
        copy: TenantCopy,
        messages: Sequence[RoutedMessage],
        results: list[RouteResult],
    ) -> None:
        # The version and the plan from one instant (no await between them).
        version = copy.version
        entries: list[NewEntry] = []
        owners: list[int] = []
        if copy.table.routes_any(tenant):  # else no entries: the append confirms the version
            planned = plan(copy.table, ((i, messages[i]) for i in idx), copy.include_qos0)
            entries, owners = planned.get(tenant, (entries, owners))
        try:
            outcomes = await self._queues.append(tenant, entries, routes_checked=version)
        except StaleRoutesError:
            self._copies.refused(tenant, version)
            await self._via_router(idx, messages, results)
            return
        except ServiceError as exc:  # the router decides (e.g. no match while queues are down)
            log.warning("direct_append_failed", extra={"code": exc.code.name})
            await self._via_router(idx, messages, results)
            return
        settle(results, owners, outcomes)

    async def _via_router(
        self, idx: list[int], messages: Sequence[RoutedMessage], results: list[RouteResult]
    ) -> None:
        try:
            routed = await self._router.route([messages[i] for i in idx])
        except Exception as exc:  # kept and retried by the pipeline
            log.warning("router_unavailable", extra={"error": type(exc).__name__})
            routed = [RouteResult.TRY_LATER] * len(idx)
        for i, r in zip(idx, routed, strict=True):
            results[i] = r
