"""Composition root of the metrics service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc
from nats.aio.client import Client
from redis.asyncio import Redis

from services.common.bus.client import connect, drain
from services.common.redis_client import redis_client
from services.common.runtime import run_service
from services.common.store.open import open_usage_store
from services.metrics.api import MetricsAdminApi, MetricsApi
from services.metrics.config import MetricsSettings
from services.metrics.core import ClusterStats
from services.metrics.exporter import serve_cluster_metrics
from services.metrics.shared import REFRESH_S, SharedReports, load_latest
from services.metrics.sys_publisher import SysPublisher
from services.router.client import RouterClient
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc

log = logging.getLogger("starling.metrics")


class MetricsService:
    def __init__(self, settings: MetricsSettings) -> None:
        self._settings = settings
        self._stats = ClusterStats(settings.node_stale_s)
        self._usage = open_usage_store(settings)
        self._nc: Client | None = None
        self._router: RouterClient | None = None
        self._sys: asyncio.Task[None] | None = None
        # Several instances share each reporter's latest report through Redis
        # (services/metrics/shared.py); one keeps them in memory.
        self._redis: Redis | None = None
        self._shared: SharedReports | None = None
        self._refresh: asyncio.Task[None] | None = None
        if settings.instance_count > 1:
            self._redis = redis_client(settings)
            self._shared = SharedReports(self._redis)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        api = MetricsApi(self._stats, self._usage, self._shared)
        pb_grpc.add_MetricsServiceServicer_to_server(api, server)
        pb_grpc.add_MetricsAdminServiceServicer_to_server(MetricsAdminApi(self._stats), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        if self._settings.cluster_metrics_port >= 0:
            port = serve_cluster_metrics(
                self._stats, self._settings.metrics_host, self._settings.cluster_metrics_port
            )
            log.info("cluster_metrics_serving", extra={"port": port})
        s = self._settings
        if self._shared is not None:
            self._refresh = asyncio.create_task(self._refresh_reports(), name="reports")
        # One instance publishes `$SYS` (services/metrics/sys_publisher.py says why index 0).
        if s.sys_interval_s > 0 and s.instance_index == 0:
            self._sys = asyncio.create_task(self._publish_sys(), name="sys-publisher")

    async def _publish_sys(self) -> None:
        """Connect to NATS (in the background: the stats API serves meanwhile), then publish
        `$SYS` until stopped."""
        s = self._settings
        while self._nc is None:
            try:
                self._nc = await connect(s.nats_url, s.node_id, **s.nats_options())
            except Exception as exc:
                log.warning("sys_nats_unavailable", extra={"error": type(exc).__name__})
                await asyncio.sleep(s.sys_interval_s)
        self._router = RouterClient(s.router_addr)
        publisher = SysPublisher(
            self._stats, self._router, self._nc, s.node_id, s.sys_operator_tenant
        )
        await publisher.run(s.sys_interval_s)

    async def _refresh_reports(self) -> None:
        """Several instances: every reporter's latest report, whichever instance got it."""
        assert self._shared is not None
        while True:
            try:
                await load_latest(self._shared, self._stats)
            except Exception as exc:  # Redis away: the reports this instance got still count
                log.warning("reports_refresh_failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(REFRESH_S)

    async def stop(self) -> None:
        for task in (self._sys, self._refresh):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._nc is not None:
            await drain(self._nc)
        if self._router is not None:
            await self._router.close()
        await self._usage.close()
        if self._redis is not None:
            await self._redis.aclose()


def main() -> int:
    return run_service("metrics", MetricsSettings, MetricsService)
