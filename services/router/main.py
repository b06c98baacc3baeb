"""Composition root of the router service: the only place that reads the environment.

The router's parts are built in `start`, each complete when built: the route fence needs the
boot report (several instances replay from where the boot stopped), the scheduler needs NATS
and the rules' feed. The gRPC server is started before `start` (services/common/runtime.py),
so it is given stand-ins for the servicers, whose calls wait until `start` built them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from nats.aio.client import Client
from redis.asyncio import Redis

from services.common.bus.client import connect, drain
from services.common.bus.large import Holder
from services.common.bus.unary import (
    ROUTE_SUBJECT,
    SETTLE_WILL_SUBJECT,
    UnaryServer,
    servicer_handler,
)
from services.common.dependencies import redis_ready
from services.common.limits_copies import LimitsCopies
from services.common.redis_client import redis_client
from services.common.refusals import Refusals, register_refusal_metrics
from services.common.route_table import RouteTable
from services.common.rpc.limits import max_message_bytes
from services.common.runtime import run_service
from services.common.store.open import open_router_store, open_session_store
from services.metrics.client import MetricsClient, report_every
from services.queue.client import QueueClient
from services.quota.client import QuotaClient
from services.router.admin import RouterAdminApi
from services.router.api import RouterApi
from services.router.boot import BootReport, load_routes
from services.router.cluster import RouteReplay, Shared
from services.router.config import RouterSettings
from services.router.copies import TablePositions
from services.router.delaying import DelayedMessages, DelayScheduler
from services.router.fencing import RouteFence
from services.router.publishing import Publisher
from services.router.quota_events import QuotaEvents
from services.router.report import router_figures
from services.router.retained import RetainedIndex
from services.router.retained_log import RetainedLogging
from services.router.retaining import Retaining
from services.rules.client import RuleFeed
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

HOLD_MESSAGES = 2  # large delayed messages held for fetching, in largest messages
log = logging.getLogger("starling.router")


class _LateServicer:
    """Stands in at the gRPC server for a servicer built later (module docstring): each
    method is a coroutine that waits for `build` and calls the built servicer's."""

    def __init__(self) -> None:
        self._servicer: object = None
        self._built = asyncio.Event()

    def build(self, servicer: object) -> None:
        self._servicer = servicer
        self._built.set()

    def __getattr__(self, name: str) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            await self._built.wait()
            return await getattr(self._servicer, name)(request, context)

        return call


@dataclass(frozen=True, slots=True)
class _Parts:
    """The router's parts that need the boot report and NATS."""

    fence: RouteFence
    retaining: Retaining
    delayed: DelayedMessages
    publisher: Publisher


class RouterService:
    def __init__(self, settings: RouterSettings) -> None:
        self._s = settings
        self._store = open_session_store(settings)
        # Retained writes are recorded in the event log too (services/router/retained_log.py).
        self._router_store = RetainedLogging(open_router_store(settings), self._store)
        self._table = RouteTable()
        self._retained = RetainedIndex()
        self._queues = QueueClient(settings.queue_addr)
        self._refusals = Refusals()
        register_refusal_metrics(self._refusals, "starling.router")
        self._positions = TablePositions()
        self._limits = (
            LimitsCopies(QuotaClient(settings.quota_addr, timeout_s=1.0))
            if settings.quota_enabled
            else None
        )
        # Several instances share their state through the store and Redis
        # (services/router/cluster.py); one alone needs neither.
        self._redis: Redis | None = None
        self._shared: Shared | None = None
        if settings.instance_count > 1:
            self._redis = redis_client(settings)
            self._shared = Shared(self._redis, settings.node_id)
        self._api = _LateServicer()
        self._admin_api = _LateServicer()
        self._nc: Client | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self._rule_feed: RuleFeed | None = None
        self._reporter: asyncio.Task[None] | None = None
        self._servers: list[UnaryServer] = []
        self.boot: BootReport | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        api = cast(pb_grpc.RouterServiceServicer, self._api)
        pb_grpc.add_RouterServiceServicer_to_server(api, server)
        admin = cast(pb_grpc.RouterAdminServiceServicer, self._admin_api)
        pb_grpc.add_RouterAdminServiceServicer_to_server(admin, server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        self._nc = nc = await connect(self._s.nats_url, self._s.node_id, **self._s.nats_options())
        if self._redis is not None:  # the instances' shared state is read below
            await redis_ready(self._redis, self._s.dependency_wait_s)
        if self._limits is not None:
            await self._limits.start(nc)
        # Delayed messages larger than one NATS message are published by reference.
        holder = Holder(self._s.node_id, HOLD_MESSAGES * max_message_bytes())
        await holder.start(nc)
        # Delayed messages reach the rules when due: the rules' filters before the scheduler
        # fires what fell due while this router was down (at most 2 s without a rules
        # instance; its next snapshot then comes with the feed's resync).
        self._rule_feed = RuleFeed(nc)
        await self._rule_feed.start()
        parts = await self._load(nc)
        scheduler = DelayScheduler(
            held=parts.delayed,
            route=parts.publisher.accept,
            nats=nc,
            holder=holder,
            rules=self._rule_feed,
            lease=self._shared.scheduler if self._shared is not None else None,
        )
        api = self._build_servicers(nc, parts, scheduler)
        self._scheduler = asyncio.create_task(scheduler.run())
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
        self._queues.use_bus(nc)
        await self._serve_over_nats(nc, api)

    async def _load(self, nc: Client) -> _Parts:
        """The latest routing snapshot and the events after its checkpoint (or a scan), then
        the parts built over it, with the retained and delayed messages loaded."""
        self.boot = boot = await load_routes(self._store, self._table)
        self._positions.booted(boot.position)
        for tenant, position in boot.tenant_positions.items():
            self._positions.logged(tenant, position)
        parts = self._build_parts(nc, boot)
        await parts.retaining.load()
        await parts.delayed.load()
        log.info(
            "route_table_loaded",
            extra={
                "subscriptions": len(self._table),
                "delayed": len(parts.delayed),
                "source": boot.source,
                "replayed": boot.replayed,
                "seconds": round(boot.seconds, 3),
            },
        )
        return parts

    def _build_parts(self, nc: Client, boot: BootReport) -> _Parts:
        s, shared = self._s, self._shared
        generations = shared.generations if shared is not None else None
        replay = (
            RouteReplay(self._store, self._table, boot, self._positions)
            if shared is not None
            else None
        )
        fence = RouteFence(queues=self._queues, nats=nc, replay=replay)
        quota = QuotaEvents(refusals=self._refusals, nats=nc)
        retaining = Retaining(
            index=self._retained,
            store=self._router_store,
            caps=s.caps(),
            quota=quota,
            limits=self._limits,
            generations=generations,
        )
        delayed = DelayedMessages(
            store=self._router_store, caps=s.caps(), quota=quota, generations=generations
        )
        publisher = Publisher(
            table=self._table,
            queues=self._queues,
            fence=fence,
            retaining=retaining,
            delayed=delayed,
            include_qos0=s.queue_qos0_offline,
            tracing=s.tracing,
            several_instances=shared is not None,
        )
        return _Parts(fence=fence, retaining=retaining, delayed=delayed, publisher=publisher)

    def _build_servicers(self, nc: Client, parts: _Parts, scheduler: DelayScheduler) -> RouterApi:
        """The gRPC servicers, handed to their stand-ins; the router's one is returned."""
        api = RouterApi(
            table=self._table,
            store=self._store,
            queues=self._queues,
            publisher=parts.publisher,
            retaining=parts.retaining,
            retained=self._retained,
            scheduler=scheduler,
            fence=parts.fence,
            include_qos0=self._s.queue_qos0_offline,
            positions=self._positions,
        )
        self._api.build(api)
        self._admin_api.build(
            RouterAdminApi(
                table=self._table,
                retained=self._retained,
                retaining=parts.retaining,
                delayed=parts.delayed,
                nats=nc,
            )
        )
        return api

    async def _serve_over_nats(self, nc: Client, api: RouterApi) -> None:
        """The persistent publish path's routing, and the CONNECT path's will settlement."""
        for subject, method, request in (
            (ROUTE_SUBJECT, api.RoutePersistent, pb.RoutePersistentRequest),
            (SETTLE_WILL_SUBJECT, api.SettleWill, pb.SettleWillRequest),
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
        if self._nc is not None:
            await drain(self._nc)
        await self._queues.close()
        if self._shared is not None:
            await self._shared.close()
        await self._store.close()
        await self._router_store.close()


def main() -> int:
    return run_service("router", RouterSettings, RouterService)
