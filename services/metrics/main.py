"""Composition root of the metrics service: the only place that reads the environment."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc

from services.common.runtime import run_service
from services.common.store.open import open_usage_store
from services.metrics.api import MetricsAdminApi, MetricsApi
from services.metrics.config import MetricsSettings
from services.metrics.core import ClusterStats
from services.metrics.exporter import serve_cluster_metrics
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc

log = logging.getLogger("starling.metrics")


class MetricsService:
    def __init__(self, settings: MetricsSettings) -> None:
        self._settings = settings
        self._stats = ClusterStats(settings.node_stale_s)
        self._usage = open_usage_store(settings)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_MetricsServiceServicer_to_server(MetricsApi(self._stats, self._usage), server)
        pb_grpc.add_MetricsAdminServiceServicer_to_server(MetricsAdminApi(self._stats), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        if self._settings.cluster_metrics_port >= 0:
            port = serve_cluster_metrics(
                self._stats, self._settings.metrics_host, self._settings.cluster_metrics_port
            )
            log.info("cluster_metrics_serving", extra={"port": port})

    async def stop(self) -> None:
        await self._usage.close()


def main() -> int:
    return run_service("metrics", MetricsSettings, MetricsService)
