"""Per-tenant trace sampling: the publishing span's tenant picks the share."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased

from services.common.telemetry import TENANT_ATTRIBUTE, TenantSampler, inject, message_spans


def _sampled(provider: TracerProvider, tenant: str, n: int = 400) -> int:
    tracer = provider.get_tracer("t")
    hits = 0
    for _ in range(n):
        with tracer.start_as_current_span(
            "mqtt.publish", attributes={TENANT_ATTRIBUTE: tenant}
        ) as s:
            hits += s.is_recording()
    return hits


def test_listed_tenants_use_their_share_and_the_others_the_default() -> None:
    provider = TracerProvider(sampler=ParentBased(TenantSampler(0.0, {"all": 1.0, "half": 0.5})))
    assert _sampled(provider, "all") == 400
    assert _sampled(provider, "other") == 0
    assert 120 < _sampled(provider, "half") < 280


def test_hops_follow_the_publish_span_and_unsampled_messages_get_no_spans() -> None:
    provider = TracerProvider(sampler=ParentBased(TenantSampler(0.0, {"all": 1.0})))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("mqtt.publish", attributes={TENANT_ATTRIBUTE: "all"}) as p:
        carrier = inject()
    hop = provider.get_tracer("hop")
    (span,) = message_spans(hop, "queue.append", [(carrier, {TENANT_ATTRIBUTE: "other"})])
    assert span.is_recording()  # the parent's decision, not the hop's own tenant attribute
    assert span.get_span_context().trace_id == p.get_span_context().trace_id
    span.end()
    assert message_spans(hop, "queue.append", []) == []
