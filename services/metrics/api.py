"""Thin gRPC servicers of the metrics service."""

from __future__ import annotations

import time

import grpc

from services.common import clock
from services.common.store.ports_usage import UsageStore
from services.metrics.client import from_pb, to_pb
from services.metrics.core import ClusterStats
from services.metrics.shared import SharedReports
from services.metrics.usage import UsageTracker, topic_counts, usage_deltas
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


class MetricsApi(pb_grpc.MetricsServiceServicer):
    def __init__(
        self,
        stats: ClusterStats,
        usage: UsageStore | None = None,
        shared: SharedReports | None = None,
    ) -> None:
        self._stats = stats
        self._usage = usage
        self._tracker = UsageTracker()  # one instance: the previous reports in memory
        self._shared = shared  # several: in Redis (services/metrics/shared.py)

    async def ReportNodeStats(
        self, request: pb.ReportNodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportNodeStatsResponse:
        if not request.node_id:
            raise ValueError("node_id is required")
        tenants = {t.tenant: from_pb(t).counts() for t in request.tenants}
        now_ms = clock.now_ms()
        if self._shared is None:
            deltas = self._tracker.deltas(request.node_id, now_ms, tenants)
        else:
            stored, prev_at, prev = await self._shared.swap(
                request.node_id,
                request.ts_ms,
                now_ms,
                request.SerializeToString(),
                request.reporter_kind,
            )
            if not stored:  # a repeat of a report already counted, or a late one
                return pb.ReportNodeStatsResponse()
            before = pb.ReportNodeStatsRequest.FromString(prev)
            deltas = usage_deltas(
                request.node_id,
                now_ms,
                tenants,
                now_ms if prev_at is None else prev_at,
                {t.tenant: from_pb(t).counts() for t in before.tenants},
            )
        self._stats.report(
            request.node_id,
            time.monotonic(),
            tenants,
            request.reporter_kind,
            request.resident_memory_bytes,
        )
        if self._usage is not None:
            # Written before the answer: a report the node saw answered is in the usage table.
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
