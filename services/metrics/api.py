"""Thin gRPC servicers of the metrics service."""

from __future__ import annotations

import time

import grpc

from services.common.store.sqlite_usage import SqliteUsageStore
from services.metrics.core import ClusterStats, TenantCounts
from services.metrics.usage import UsageTracker
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


class MetricsApi(pb_grpc.MetricsServiceServicer):
    def __init__(self, stats: ClusterStats, usage: SqliteUsageStore | None = None) -> None:
        self._stats = stats
        self._usage = usage
        self._tracker = UsageTracker()

    async def ReportNodeStats(
        self, request: pb.ReportNodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportNodeStatsResponse:
        if not request.node_id:
            raise ValueError("node_id is required")
        tenants = {
            t.tenant: TenantCounts(t.connections, t.messages_in, t.messages_out, t.messages_dropped)
            for t in request.tenants
        }
        self._stats.report(request.node_id, time.monotonic(), tenants)
        if self._usage is not None:
            # Written before the answer: a report the node saw answered is in the usage table.
            now_ms = int(time.time() * 1000)
            await self._usage.add(self._tracker.deltas(request.node_id, now_ms, tenants))
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
            tenants=[
                pb.TenantCounters(
                    tenant=name,
                    connections=c.connections,
                    messages_in=c.messages_in,
                    messages_out=c.messages_out,
                    messages_dropped=c.messages_dropped,
                )
                for name, c in sorted(totals.items())
            ],
        )
