"""Typed client of the metrics service (used by connection nodes to report their counters)."""

from __future__ import annotations

import time

from services.common.rpc.server import LazyStub
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


class MetricsClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._lazy = LazyStub(address, pb_grpc.MetricsServiceStub)
        self._timeout = timeout_s

    async def report(self, node_id: str, tenants: list[pb.TenantCounters]) -> None:
        await self._lazy.stub.ReportNodeStats(
            pb.ReportNodeStatsRequest(
                node_id=node_id, tenants=tenants, ts_ms=int(time.time() * 1000)
            ),
            timeout=self._timeout,
        )

    async def close(self) -> None:
        await self._lazy.close()
