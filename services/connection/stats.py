"""Per-tenant counters of a node, and their export: reports to the metrics service every
`stats_interval_s`, and OpenTelemetry observables (scraped through the Prometheus endpoint).

Counters are kept per batch, not per message, on the hot path: `messages_in` grows by the size
of each batch a client hands over; deliveries and drops are counted by each connection's
outbound side and folded into the tenant's totals when the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry import metrics

from services.connection.conn import Conn
from services.metrics.client import MetricsClient, TenantCounters

log = logging.getLogger("starling.connection.stats")


@dataclass(slots=True)
class Tally:
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0


class NodeStats:
    def __init__(self, conns: set[Conn]) -> None:
        self._conns = conns  # the registry's open connections
        self._closed: dict[str, Tally] = {}  # tenant -> totals, ended connections included

    def for_tenant(self, tenant: str) -> Tally:
        t = self._closed.get(tenant)
        if t is None:
            t = self._closed[tenant] = Tally()
        return t

    def connection_ended(self, conn: Conn) -> None:
        ch = conn.channel
        t = self.for_tenant(ch.tenant)
        t.messages_out += ch.outbound.sent
        t.dropped += ch.outbound.dropped

    def by_tenant(self) -> dict[str, Tally]:
        """Per tenant: closed connections' totals plus the live ones' counters."""
        out = {t: Tally(c.messages_in, c.messages_out, c.dropped) for t, c in self._closed.items()}
        for conn in list(self._conns):
            ch = conn.channel
            if not ch.tenant:
                continue
            t = out.setdefault(ch.tenant, Tally())
            t.messages_out += ch.outbound.sent
            t.dropped += ch.outbound.dropped
        return out

    def connections_by_tenant(self) -> dict[str, int]:
        """Open connections per tenant ("" for those not yet authenticated)."""
        out: dict[str, int] = {}
        for conn in list(self._conns):
            t = conn.channel.tenant
            out[t] = out.get(t, 0) + 1
        return out

    def report(self) -> list[TenantCounters]:
        conns = self.connections_by_tenant()
        return [
            TenantCounters(
                tenant=t,
                connections=conns.get(t, 0),
                messages_in=c.messages_in,
                messages_out=c.messages_out,
                messages_dropped=c.dropped,
            )
            for t, c in sorted(self.by_tenant().items())
        ]


async def report_stats(
    node_id: str, stats: NodeStats, client: MetricsClient, interval_s: float
) -> None:
    """Report to the metrics service every `interval_s`; a missed report is only logged."""
    try:
        while True:
            try:
                await client.report(node_id, stats.report())
            except Exception as exc:
                log.warning("stats_report_failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(interval_s)
    finally:
        await client.close()


def register_metrics(stats: NodeStats) -> None:
    meter = metrics.get_meter("starling.connection")

    def by_tenant(field: str) -> Callable[[object], Iterable[metrics.Observation]]:
        def observe(_o: object) -> Iterable[metrics.Observation]:
            for tenant, c in stats.by_tenant().items():
                yield metrics.Observation(getattr(c, field), {"tenant": tenant})

        return observe

    for name, field, description in (
        ("starling_messages_in", "messages_in", "PUBLISH packets accepted from clients"),
        ("starling_messages_out", "messages_out", "PUBLISH packets written to clients"),
        (
            "starling_messages_dropped",
            "dropped",
            "Deliveries dropped (slow consumer, queue full, too large)",
        ),
    ):
        meter.create_observable_counter(name, [by_tenant(field)], description=description)

    def connections(_o: object) -> Iterable[metrics.Observation]:
        for tenant, n in stats.connections_by_tenant().items():
            yield metrics.Observation(n, {"tenant": tenant or "-"})

    meter.create_observable_gauge(
        "starling_connections", [connections], description="Open MQTT connections"
    )
