"""Publishes the `$SYS/broker/...` tree (services/metrics/sys_tree.py) of every tenant into
that tenant's own topic space every `sys_interval_s`, as retained QoS 0 messages; the
operator tenant (`sys_operator_tenant`) gets the cluster's totals instead of its own.

How a message gets there, as a node's retained publish does (services/common/bus/
publisher.py): the router stores it (its retained store answers every later SUBSCRIBE, on
any node), then it goes out on its topic's NATS subject (`mqd.<tenant>...`, the `$`-topic
prefix, so `#` never matches it [MQTT-4.7.2-1]) to the clients subscribed now. A value the
router did not keep is published again next round. QoS 0: a persistent session that is away does
not pile up stale figures in its queue; the retained value is there when it subscribes.

Only one metrics instance publishes: the one with `instance_index` 0 (a fixed choice, no
lease: with it down, `$SYS` stops being refreshed until it is back; the retained values stay).
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib.metadata import PackageNotFoundError, version

from nats.aio.client import Client

from services.common.bus.publisher import ServicePublisher
from services.common.message import Message
from services.metrics.core import ClusterStats, TenantCounts
from services.metrics.sys_tree import SysTree
from services.router.client import RouterClient
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.metrics.sys")

NO_TENANT = ("", "-")  # connections not yet authenticated belong to no tenant


def starling_version() -> str:
    try:
        return version("starling")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def views(totals: dict[str, TenantCounts], operator: str) -> dict[str, TenantCounts]:
    """What each tenant sees: its own figures; the operator tenant the sum of everyone's."""
    out = {t: c for t, c in totals.items() if t not in NO_TENANT}
    if operator:
        cluster = TenantCounts()
        for c in totals.values():
            cluster.add(c)
        out[operator] = cluster
    return out


class SysPublisher:
    def __init__(
        self,
        stats: ClusterStats,
        router: RouterClient,
        nc: Client,
        node_id: str,
        operator_tenant: str,
    ) -> None:
        self._stats = stats
        self._operator = operator_tenant
        self._publisher = ServicePublisher(nc, router, node_id, not_kept=self._not_kept)
        self._version = starling_version()
        self._trees: dict[str, SysTree] = {}
        self._started = time.monotonic()

    async def run(self, interval_s: float) -> None:
        """Publish every `interval_s` until cancelled; a failed round is logged, and what it
        could not store is published again the next time."""
        while True:
            try:
                await self.publish_once()
            except Exception:
                log.exception("sys_publish_failed")
            await asyncio.sleep(interval_s)

    async def publish_once(self) -> int:
        """One round; the number of messages published."""
        now = time.monotonic()
        _, totals = self._stats.totals(now)
        memory = self._stats.memory_bytes(now)
        wall = time.time()
        messages: list[Message] = []
        for tenant, c in sorted(views(totals, self._operator).items()):
            tree = self._trees.get(tenant)
            if tree is None:
                tree = self._trees[tenant] = SysTree(self._version)
            mine = memory if tenant == self._operator else None  # the cluster's, not a tenant's
            for topic, payload in tree.update(c, now, now - self._started, mine):
                messages.append(Message(tenant, topic, payload, 0, True, published_at=wall))
        if messages:
            await self._publisher.publish(messages)
        return len(messages)

    def _not_kept(self, env: RoutedMessage) -> None:
        # Not kept (the router unreachable, or the tenant at its retained cap): the value is
        # published again next round.
        tree = self._trees.get(env.tenant)
        if tree is not None:
            tree.published.pop(env.topic, None)
