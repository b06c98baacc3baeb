"""The cluster's Prometheus endpoint: per-tenant series summed over the live reporters
(services/metrics/core.py), served on `cluster_metrics_port` beside the process's own
/metrics. docs/metrics.md lists every series; deploy/grafana/ charts them.

Counters are sums of cumulative per-reporter counters: when a node stops reporting (dead, or
silent for `node_stale_s`) its part leaves the sum, which Prometheus' rate() reads as a
counter reset; the rates around such a moment are off for one scrape interval.

The collector runs on the HTTP server's thread; it reads a snapshot of the reports
(`ClusterStats.totals`), never the event loop's objects while they change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from services.common.latency_bounds import LATENCY_BOUNDS_S
from services.metrics.core import ClusterStats, TenantCounts

PREFIX = "starling_cluster_"
NO_TENANT = "-"  # connections not yet authenticated
# (series, help, figure) of the per-tenant gauges
_GAUGES: tuple[tuple[str, str, Callable[[TenantCounts], int]], ...] = (
    ("connections", "Open MQTT connections", lambda c: c.connections),
    ("subscriptions", "Subscriptions (persistent sessions' and connected clients')",
     lambda c: c.subscriptions),
    ("sessions_persistent", "Persistent sessions with at least one subscription",
     lambda c: c.sessions_persistent),
    ("retained_messages", "Retained messages held", lambda c: c.retained_messages),
    ("retained_bytes", "Bytes of the retained messages held", lambda c: c.retained_bytes),
    ("queue_depth", "Entries waiting in persistent sessions' queues", lambda c: c.queue_depth),
)  # fmt: skip
# (series, help, figure) of the per-tenant counters without another label
_COUNTERS: tuple[tuple[str, str, Callable[[TenantCounts], int]], ...] = (
    (
        "bytes_received",
        "message bytes (payload + topic) received from clients",
        lambda c: c.bytes_in,
    ),
    ("bytes_sent", "message bytes (payload + topic) sent to clients", lambda c: c.bytes_out),
    ("quota_refusals", "Requests refused by a tenant or user quota", lambda c: c.quota_refusals),
)
_DROP_CAUSES: tuple[tuple[str, Callable[[TenantCounts], int]], ...] = (
    ("slow_consumer", lambda c: c.dropped_slow_consumer),
    ("queue_full", lambda c: c.dropped_queue_full),
    ("too_large", lambda c: c.dropped_too_large),
    ("quota", lambda c: c.dropped_quota),
    ("expired", lambda c: c.expired),
    ("queue_depth_limit", lambda c: c.queue_dropped),
)


def series_names() -> list[str]:
    """Every series name the endpoint can expose (as a query names it: counters with
    `_total`, histograms with `_bucket`, `_sum`, `_count`)."""
    names = [PREFIX + n for n, _, _ in _GAUGES]
    names += [PREFIX + n + "_total" for n, _, _ in _COUNTERS]
    names += [
        f"{PREFIX}sessions",
        f"{PREFIX}messages_received_total",
        f"{PREFIX}messages_sent_total",
        f"{PREFIX}messages_dropped_total",
        f"{PREFIX}reporters",
    ]
    names += [f"{PREFIX}publish_ack_latency_seconds_{s}" for s in ("bucket", "sum", "count")]
    return names


class ClusterCollector(Collector):
    def __init__(self, stats: ClusterStats, clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        _, totals = self._stats.totals(now)
        rows = sorted((t or NO_TENANT, c) for t, c in totals.items())
        reporters = GaugeMetricFamily(
            PREFIX + "reporters", "Live reporters by kind", labels=["kind"]
        )
        for kind, n in sorted(self._stats.live(now).items()):
            reporters.add_metric([kind or "node"], n)
        yield reporters
        for name, help_, figure in _GAUGES:
            g = GaugeMetricFamily(PREFIX + name, help_, labels=["tenant"])
            for tenant, c in rows:
                g.add_metric([tenant], figure(c))
            yield g
        yield self._sessions(rows)
        for name, help_, figure in _COUNTERS:
            k = CounterMetricFamily(PREFIX + name, help_, labels=["tenant"])
            for tenant, c in rows:
                k.add_metric([tenant], figure(c))
            yield k
        yield from self._messages(rows)
        yield self._latency(rows)

    @staticmethod
    def _sessions(rows: list[tuple[str, TenantCounts]]) -> Metric:
        g = GaugeMetricFamily(
            PREFIX + "sessions",
            "Sessions: online (connected clients) and offline (persistent, not connected)",
            labels=["tenant", "state"],
        )
        for tenant, c in rows:
            g.add_metric([tenant, "online"], c.sessions_online)
            offline = max(0, c.sessions_persistent - c.sessions_persistent_online)
            g.add_metric([tenant, "offline"], offline)
        return g

    @staticmethod
    def _messages(rows: list[tuple[str, TenantCounts]]) -> Iterator[Metric]:
        received = CounterMetricFamily(
            PREFIX + "messages_received",
            "PUBLISH packets accepted from clients",
            labels=["tenant", "qos"],
        )
        sent = CounterMetricFamily(
            PREFIX + "messages_sent", "PUBLISH packets written to clients", labels=["tenant", "qos"]
        )
        dropped = CounterMetricFamily(
            PREFIX + "messages_dropped", "Messages dropped, by cause", labels=["tenant", "cause"]
        )
        for tenant, c in rows:
            for qos, n_in, n_out in (
                ("0", c.msgs_in_q0, c.msgs_out_q0),
                ("1", c.msgs_in_q1, c.msgs_out_q1),
                ("2", c.msgs_in_q2, c.msgs_out_q2),
            ):
                received.add_metric([tenant, qos], n_in)
                sent.add_metric([tenant, qos], n_out)
            for cause, figure in _DROP_CAUSES:
                dropped.add_metric([tenant, cause], figure(c))
        yield from (received, sent, dropped)

    @staticmethod
    def _latency(rows: list[tuple[str, TenantCounts]]) -> Metric:
        h = HistogramMetricFamily(
            PREFIX + "publish_ack_latency_seconds",
            "QoS 1/2 publish to PUBACK/PUBREC, as the publishing node measured it",
            labels=["tenant"],
        )
        for tenant, c in rows:
            counts = c.ack_latency_buckets
            if not counts:
                continue
            cumulative = []
            total = 0
            bounds = [*(repr(b) for b in LATENCY_BOUNDS_S), "+Inf"]
            for bound, n in zip(bounds, counts, strict=False):
                total += n
                cumulative.append((bound, total))
            h.add_metric([tenant], cumulative, c.ack_latency_sum_s)
        return h


def serve_cluster_metrics(stats: ClusterStats, host: str, port: int) -> int:
    """Start the endpoint on its own thread; the port it bound."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(stats))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)
