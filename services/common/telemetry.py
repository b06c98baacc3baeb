"""OpenTelemetry set-up: traces (OTLP when configured), metrics (Prometheus scrape endpoint).

`setup_telemetry` is called once per process by the service runtime; code elsewhere uses
`trace.get_tracer(__name__)` and `metrics.get_meter(__name__)` as usual. `inject`/`extract`
carry W3C trace context through NATS headers and gRPC metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased


@dataclass(frozen=True, slots=True)
class Telemetry:
    metrics_port: int | None
    tracer_provider: TracerProvider


def setup_telemetry(
    service: str,
    node_id: str,
    *,
    metrics_port: int,
    otlp_endpoint: str = "",
    sample_ratio: float = 0.0,
    extra_span_processor: SpanProcessor | None = None,
) -> Telemetry:
    """Install global tracer and meter providers; start the Prometheus endpoint if asked."""
    resource = Resource.create(
        {"service.name": f"starling-{service}", "service.instance.id": node_id}
    )
    tp = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if extra_span_processor is not None:
        tp.add_span_processor(extra_span_processor)
    trace.set_tracer_provider(tp)

    readers: list[MetricReader] = []
    port: int | None = None
    if metrics_port >= 0:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        readers.append(PrometheusMetricReader())
        server, _thread = start_http_server(metrics_port, addr="127.0.0.1")
        port = int(server.server_port)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=otlp_endpoint)))
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    return Telemetry(port, tp)


def inject(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """Current trace context as W3C headers (empty when nothing is sampled)."""
    out = carrier if carrier is not None else {}
    propagate.inject(out)
    return out


def extract(carrier: Mapping[str, str] | None) -> context.Context:
    return propagate.extract(dict(carrier) if carrier else {})
