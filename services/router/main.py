"""Composition root of the router service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc
from nats.aio.client import Client
from redis.asyncio import Redis

from services.common.bus.client import LateClient, connect, drain
from services.common.bus.large import Holder
from services.common.bus.unary import (
    ROUTE_SUBJECT,
    SETTLE_WILL_SUBJECT,
    UnaryServer,
    servicer_handler,
)
from services.common.dependencies import redis_ready
from services.common.redis_client import redis_client
from services.common.refusals import Refusals, register_refusal_metrics
from services.common.rpc.limits import max_message_bytes
from services.common.runtime import run_service
from services.common.store.open import open_router_store, open_session_store
from services.metrics.client import MetricsClient, report_every
from services.queue.client import QueueClient
from services.quota.client import QuotaClient
from services.quota.copies import LimitsCopies
from services.router.admin import RouterAdminApi
from services.router.api import RouterApi
from services.router.boot import BootReport, load_routes
from services.router.cluster import RouteReplay, Shared
from services.router.config import RouterSettings
from services.router.copies import TablePositions
from services.router.core import RouteTable
from services.router.fencing import RouteFence
from services.router.publishing import Publisher
from services.router.report import router_figures
from services.router.retained import RetainedIndex
from services.router.retained_log import RetainedLogging
from services.rules.client import RuleFeed
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

HOLD_MESSAGES = 2  # large delayed messages held for fetching, in largest messages
log = logging.getLogger("starling.router")


class RouterService:
    def __init__(self, settings: RouterSettings) -> None:
        self._s = settings
        self._store = open_session_store(settings)
        # Retained writes are recorded in the event log too (services/router/retained_log.py).
        self._router_store = RetainedLogging(open_router_store(settings), self._store)
        self._table = RouteTable()
        self._retained = RetainedIndex()
        self._queues = QueueClient(settings.queue_addr)
        self._nats = LateClient()
        self._refusals = Refusals()
        register_refusal_metrics(self._refusals, "starling.router")
        self._fence = RouteFence(self._queues, self._nats)
        self._positions = TablePositions()
        self._limits = (
            LimitsCopies(QuotaClient(settings.quota_addr, timeout_s=1.0))
            if settings.quota_enabled
            else None
        )
        self._publisher = self._build_publisher()
        # Several instances share their state through the store and Redis
        # (services/router/cluster.py); one alone needs neither.
        self._redis: Redis | None = None
        self._shared: Shared | None = None
        if settings.instance_count > 1:
            self._redis = redis_client(settings)
            self._shared = self._publisher.shared = Shared(self._redis, settings.node_id)
        self._scheduler: asyncio.Task[None] | None = None
        self._rule_feed: RuleFeed | None = None
        self._reporter: asyncio.Task[None] | None = None
        self._api = RouterApi(
            self._table,
            self._store,
            self._queues,
            self._publisher,
            self._retained,
            self._fence,
            settings.queue_qos0_offline,
            self._positions,
        )
        self._servers: list[UnaryServer] = []
        self.boot: BootReport | None = None

    def _build_publisher(self) -> Publisher:
        publisher = Publisher(
            self._table,
            self._queues,
            self._retained,
            self._router_store,
            self._nats,
            self._s.caps(),
            self._s.queue_qos0_offline,
            self._fence,
            self._refusals,
            self._limits,
        )
        publisher.tracing = self._s.tracing
        return publisher

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_RouterServiceServicer_to_server(self._api, server)
        pb_grpc.add_RouterAdminServiceServicer_to_server(
            RouterAdminApi(
                self._table, self._retained, self._publisher, self._router_store, self._nats
            ),
            server,
        )
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        self._nats.nc = await connect(self._s.nats_url, self._s.node_id, **self._s.nats_options())
        if self._redis is not None:  # the instances' shared state is read below
            await redis_ready(self._redis, self._s.dependency_wait_s)
        if self._limits is not None:
            await self._limits.start(self._nats.nc)
        # Delayed messages larger than one NATS message are published by reference.
        holder = Holder(self._s.node_id, HOLD_MESSAGES * max_message_bytes())
        await holder.start(self._nats.nc)
        self._publisher.holder = holder
        # Delayed messages reach the rules when due: the rules' filters before the scheduler
        # fires what fell due while this router was down (at most 2 s without a rules
        # instance; its next snapshot then comes with the feed's resync).
        self._rule_feed = RuleFeed(self._nats.nc)
        self._publisher.rules = self._rule_feed
        await self._rule_feed.start()
        await self._load_table()
        self._scheduler = asyncio.create_task(self._publisher.run_scheduler())
        self._reporter = asyncio.create_task(
            report_every(
                MetricsClient(self._s.metrics_addr),
                f"router:{self._s.node_id}",
                lambda: router_figures(self._table, self._retained, self._refusals),
                self._s.stats_interval_s,
                kind="router",
            )
        )
        # The persistent publish path: routes over NATS once the table is loaded, appends too.
        self._queues.use_bus(self._nats.nc)
        await self._serve_over_nats(self._nats.nc)

    async def _load_table(self) -> None:
        """The latest routing snapshot and the events after its checkpoint (or a scan), and
        the delayed messages."""
        self.boot = boot = await load_routes(self._store, self._table)
        if self._shared is not None:
            self._fence.replay = RouteReplay(self._store, self._table, boot, self._positions)
        self._positions.booted(boot.position)
        for tenant, position in boot.tenant_positions.items():
            self._positions.logged(tenant, position)
        await self._publisher.load()
        log.info(
            "route_table_loaded",
            extra={
                "subscriptions": len(self._table),
                "delayed": len(self._publisher.schedule),
                "source": boot.source,
                "replayed": boot.replayed,
                "seconds": round(boot.seconds, 3),
            },
        )

    async def _serve_over_nats(self, nc: Client) -> None:
        """The persistent publish path's routing, and the CONNECT path's will settlement."""
        for subject, method, request in (
            (ROUTE_SUBJECT, self._api.RoutePersistent, pb.RoutePersistentRequest),
            (SETTLE_WILL_SUBJECT, self._api.SettleWill, pb.SettleWillRequest),
        ):
            handler = servicer_handler(method, request)
            server = UnaryServer(nc, subject, "router", handler)
            await server.start()
            self._servers.append(server)

    async def stop(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
        for server in self._servers:
            await server.stop()
        if self._scheduler is not None:
            self._scheduler.cancel()
        if self._rule_feed is not None:
            await self._rule_feed.stop()
        if self._limits is not None:
            await self._limits.stop()
        if self._nats.nc is not None:
            await drain(self._nats.nc)
        await self._queues.close()
        if self._shared is not None:
            await self._shared.close()
        await self._store.close()
        await self._router_store.close()


def main() -> int:
    return run_service("router", RouterSettings, RouterService)
