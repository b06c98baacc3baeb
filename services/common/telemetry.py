"""OpenTelemetry set-up: traces (OTLP and/or a JSON-lines file when configured), metrics
(Prometheus scrape endpoint).

`setup_telemetry` is called once per process by the service runtime; code elsewhere uses
`trace.get_tracer(__name__)` and `metrics.get_meter(__name__)` as usual. `inject`/`extract`
carry W3C trace context through NATS headers and gRPC metadata; a message's own context
travels in its envelope (`RoutedMessage.trace_context`, also stored with queued entries), and
`message_spans` opens one span per traced message of a batch, as a child of that context.

Sampling is decided once, where a message enters (the publishing node's `mqtt.publish` span,
per tenant: `TenantSampler`); every later span follows its parent (ParentBased), and a message
that was not sampled carries no context at all, so no process opens a span for it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.util.types import Attributes

TENANT_ATTRIBUTE = "starling.tenant"
# The file exporter's batches leave this often: a local mesh's spans show up within a second.
_FILE_EXPORT_DELAY_MS = 200


class TenantSampler(Sampler):
    """The trace-id ratio of the span's tenant (its `starling.tenant` attribute), or the
    default ratio: one tenant can be traced in full while the others cost nothing."""

    def __init__(self, default: float, per_tenant: Mapping[str, float]) -> None:
        self._default = TraceIdRatioBased(default)
        self._tenants = {t: TraceIdRatioBased(r) for t, r in per_tenant.items()}

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        tenant = attributes.get(TENANT_ATTRIBUTE) if attributes else None
        sampler = self._tenants.get(tenant, self._default) if isinstance(tenant, str) else None
        return (sampler or self._default).should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"TenantSampler({self._default.rate}, {len(self._tenants)} tenants)"


class JsonLinesExporter(SpanExporter):
    """Finished spans as JSON lines in one file (the local mesh's trace store: `grep` a trace
    id across `<dir>/*.jsonl`)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(json.loads(s.to_json()), separators=(",", ":")) for s in spans]
        with self._lock:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


@dataclass(frozen=True, slots=True)
class Telemetry:
    metrics_port: int | None
    tracer_provider: TracerProvider


def setup_telemetry(
    service: str,
    node_id: str,
    *,
    metrics_port: int,
    metrics_host: str = "127.0.0.1",
    otlp_endpoint: str = "",
    sample_ratio: float = 0.0,
    sample_tenants: Mapping[str, float] | None = None,
    trace_file_dir: Path | None = None,
    extra_span_processor: SpanProcessor | None = None,
) -> Telemetry:
    """Install global tracer and meter providers; start the Prometheus endpoint if asked."""
    resource = Resource.create(
        {"service.name": f"starling-{service}", "service.instance.id": node_id}
    )
    sampler = ParentBased(TenantSampler(sample_ratio, sample_tenants or {}))
    tp = TracerProvider(resource=resource, sampler=sampler)
    # Nothing can be sampled: no exporter (and no export thread) at all.
    sampling = sample_ratio > 0 or any((sample_tenants or {}).values())
    if trace_file_dir is not None and sampling:
        exporter = JsonLinesExporter(trace_file_dir / f"{node_id}.jsonl")
        tp.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=_FILE_EXPORT_DELAY_MS)
        )
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
        server, _thread = start_http_server(metrics_port, addr=metrics_host)
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


def message_spans(
    tracer: trace.Tracer,
    name: str,
    traced: Iterable[tuple[Mapping[str, str], Attributes]],
    kind: SpanKind = SpanKind.INTERNAL,
) -> list[Span]:
    """One started span per traced message (its envelope's context, attributes), each a
    child of its message's publish span; the caller ends them when the work is done. Spans
    of a batch are not made current: the messages of one batch belong to different traces."""
    return [
        tracer.start_span(name, context=extract(carrier), kind=kind, attributes=attrs)
        for carrier, attrs in traced
    ]
