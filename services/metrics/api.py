"""Thin gRPC servicers of the metrics service."""

from __future__ import annotations

import time

import grpc

from services.common.store.ports import UsageStore
from services.metrics.client import from_pb, to_pb
from services.metrics.core import ClusterStats
from services.metrics.usage import UsageTracker, topic_counts
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


class MetricsApi(pb_grpc.MetricsServiceServicer):
    def __init__(self, stats: ClusterStats, usage: UsageStore | None = None) -> None:
        self._stats = stats
        self._usage = usage
        self._tracker = UsageTracker()

    async def ReportNodeStats(
        self, request: pb.ReportNodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportNodeStatsResponse:
        if not request.node_id:
            raise ValueError("node_id is required")
        tenants = {t.tenant: from_pb(t).counts() for t in request.tenants}
        self._stats.report(
            request.node_id,
            time.monotonic(),
            tenants,
            request.reporter_kind,
            request.resident_memory_bytes,
        )
        if self._usage is not None:
            # Written before the answer: a report the node saw answered is in the usage table.
            now_ms = int(time.time() * 1000)
            deltas = self._tracker.deltas(request.node_id, now_ms, tenants)
            await self._usage.add(deltas, topic_counts(now_ms, tenants))
        return pb.ReportNodeStatsResponse()


class MetricsAdminApi(pb_grpc.MetricsAdminServiceServicer):
    def __init__(self, stats: ClusterStats) -> None:
        self._stats = stats

    async def GetClusterStats(
        self, request: pb.GetClusterStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetClusterStatsResponse:
        nodes, totals = self._stats.totals(time.monotonic())
        return pb.GetClusterStatsResponse(
            nodes=nodes,
            tenants=[to_pb(name, c) for name, c in sorted(totals.items())],
        )
