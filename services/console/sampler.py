"""Takes the overview's samples: every `interval_s`, one console replica (the one that claims
the slot in Redis) asks the metrics service for every tenant's figures (GetClusterStats) and
every instance for its health (and each node for its own figures), and appends one sample
for the cluster and one per tenant to the history (services/console/history.py).

It calls with the operator token, because the figures of every tenant and the nodes' admin
APIs are the operator's; what a page shows from them is scoped by `scope()` as always."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.common.rpc.errors import ServiceError
from services.console.history import History
from services.console.instances import Directory, probe
from services.console.series import ClusterSample, Counts, TenantSample
from services.console.signin import now_ms
from services.metrics.client import ClusterTotals, MetricsAdminClient

log = logging.getLogger("starling.console.sampler")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampler:
    history: History
    metrics: MetricsAdminClient  # with the operator token
    directory: Directory
    operator_token: str
    interval_s: float

    async def sample_once(self, at_ms: int) -> bool:
        """Take the sample of the slot `at_ms` falls in, unless another replica did; True
        when this one took it."""
        slot = int(at_ms // (self.interval_s * 1000))
        if not await self.history.claim(slot, self.interval_s * 3):
            return False
        totals: ClusterTotals | None
        try:
            totals = await self.metrics.cluster_stats()
        except ServiceError as exc:
            log.warning("console_sample_stats_failed", extra={"error": str(exc)})
            totals = None
        health = await probe(self.directory.instances(), self.operator_token)
        tenants = {
            t.tenant: TenantSample(
                at_ms=at_ms,
                counts=Counts(
                    connections=t.connections,
                    messages_in=t.messages_in,
                    messages_out=t.messages_out,
                    dropped=t.messages_dropped,
                    sessions=t.sessions_persistent,
                ),
            )
            for t in (totals.tenants if totals else ())
        }
        total = Counts(
            **{
                f: sum(getattr(s.counts, f) for s in tenants.values())
                for f in ("connections", "messages_in", "messages_out", "dropped", "sessions")
            }
        )
        cluster = ClusterSample(
            at_ms=at_ms,
            nodes_reporting=totals.nodes if totals else 0,
            totals=total,
            instances=health,
        )
        await self.history.add(cluster, tenants)
        return True

    async def run(self) -> None:
        """Sample every `interval_s` until cancelled; a failed sample is logged and skipped."""
        while True:
            try:
                await self.sample_once(now_ms())
            except Exception as exc:  # Redis away: the next slot tries again
                log.warning("console_sample_failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(self.interval_s - (now_ms() / 1000) % self.interval_s)
