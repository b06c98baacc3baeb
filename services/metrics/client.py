"""Typed clients of the metrics service: `MetricsClient` for connection nodes (they report
their counters), `MetricsAdminClient` for operators (`starling stats`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.rpc.client import LazyStub
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantCounters:
    """One tenant's counters: a node's since it started, or the cluster's sum."""

    tenant: str
    connections: int = 0  # open now
    messages_in: int = 0
    messages_out: int = 0
    messages_dropped: int = 0


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    tenants: tuple[TenantCounters, ...]  # by tenant name
    nodes: int  # nodes whose latest report is recent enough to count


def _to_pb(c: TenantCounters) -> pb.TenantCounters:
    return pb.TenantCounters(
        tenant=c.tenant,
        connections=c.connections,
        messages_in=c.messages_in,
        messages_out=c.messages_out,
        messages_dropped=c.messages_dropped,
    )


def _from_pb(c: pb.TenantCounters) -> TenantCounters:
    return TenantCounters(
        tenant=c.tenant,
        connections=c.connections,
        messages_in=c.messages_in,
        messages_out=c.messages_out,
        messages_dropped=c.messages_dropped,
    )


class MetricsClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.MetricsServiceStub, timeout_s=timeout_s)

    async def report(self, node_id: str, counters: Sequence[TenantCounters]) -> None:
        """This node's latest counters; each report replaces the node's previous one."""
        req = pb.ReportNodeStatsRequest(
            node_id=node_id,
            tenants=[_to_pb(c) for c in counters],
            ts_ms=int(time.time() * 1000),
        )
        await self._rpc.call(self._rpc.stub.ReportNodeStats, req)

    async def close(self) -> None:
        await self._rpc.close()


class MetricsAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.MetricsAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def cluster_stats(self) -> ClusterTotals:
        """Every tenant's counters summed over the nodes that reported recently."""
        resp = await self._rpc.call(self._rpc.stub.GetClusterStats, pb.GetClusterStatsRequest())
        return ClusterTotals(tuple(_from_pb(t) for t in resp.tenants), resp.nodes)

    async def close(self) -> None:
        await self._rpc.close()
