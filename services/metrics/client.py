"""Typed clients of the metrics service: `MetricsClient` for connection nodes (they report
their counters), `MetricsAdminClient` for operators (`starling stats`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.common.clock import now_ms
from services.common.rpc.client import LazyStub
from services.metrics.core import SUMMED, TenantCounts
from starling.metrics.v1 import metrics_pb2 as pb
from starling.metrics.v1 import metrics_pb2_grpc as pb_grpc

log = logging.getLogger("starling.metrics.client")

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(slots=True, kw_only=True)
class TenantCounters(TenantCounts):
    """One tenant's figures as a reporter sends them: the tenant and its counts (one list
    of fields, services/metrics/core.py's)."""

    tenant: str

    def counts(self) -> TenantCounts:
        """The figures without the tenant, as the metrics service sums them."""
        return TenantCounts(
            **{n: getattr(self, n) for n in SUMMED},
            top_topics=self.top_topics,
            ack_latency_buckets=self.ack_latency_buckets,
            ack_latency_sum_s=self.ack_latency_sum_s,
        )


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    tenants: tuple[TenantCounters, ...]  # by tenant name
    nodes: int  # nodes whose latest report is recent enough to count


def to_pb(tenant: str, c: TenantCounts | TenantCounters) -> pb.TenantCounters:
    return pb.TenantCounters(
        tenant=tenant,
        **{n: getattr(c, n) for n in SUMMED},
        top_topics=[pb.TopicCount(topic=t, messages=m) for t, m in c.top_topics],
        ack_latency_buckets=c.ack_latency_buckets,
        ack_latency_sum_s=c.ack_latency_sum_s,
    )


def from_pb(c: pb.TenantCounters) -> TenantCounters:
    return TenantCounters(
        tenant=c.tenant,
        **{n: getattr(c, n) for n in SUMMED},
        top_topics=tuple((t.topic, t.messages) for t in c.top_topics),
        ack_latency_buckets=tuple(c.ack_latency_buckets),
        ack_latency_sum_s=c.ack_latency_sum_s,
    )


def resident_memory_bytes() -> int:
    """This process's resident set size in bytes (Linux: /proc/self/statm, as Prometheus'
    process_resident_memory_bytes); 0 where the system does not say."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


class MetricsClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.MetricsServiceStub, timeout_s=timeout_s)

    async def report(
        self, node_id: str, counters: Sequence[TenantCounters], kind: str = ""
    ) -> None:
        """This reporter's latest figures; each report replaces its previous one. `kind`:
        "" for a connection node, else the service ("session", "router", "queue")."""
        req = pb.ReportNodeStatsRequest(
            node_id=node_id,
            tenants=[to_pb(c.tenant, c) for c in counters],
            ts_ms=now_ms(),
            reporter_kind=kind,
            resident_memory_bytes=resident_memory_bytes(),
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
        return ClusterTotals(tuple(from_pb(t) for t in resp.tenants), resp.nodes)

    async def close(self) -> None:
        await self._rpc.close()


async def report_every(
    client: MetricsClient,
    reporter_id: str,
    gather: Callable[[], list[TenantCounters]],
    interval_s: float,
    kind: str = "",
) -> None:
    """Report `gather()` to the metrics service every `interval_s` until cancelled; a missed
    report is only logged (the next one carries the cumulative counters again)."""
    try:
        while True:
            try:
                await client.report(reporter_id, gather(), kind)
            except Exception as exc:
                log.warning("stats_report_failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(interval_s)
    finally:
        await client.close()
