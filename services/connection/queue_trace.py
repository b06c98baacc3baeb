"""The trace span of a sampled message's last hop (`deliver_traced`): its delivery from a
persistent session's queue to the client, a consumer span in the trace its publisher began.
Only messages sampled where they were published carry a trace context; the rest go out
without this (persistence.py)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.common.telemetry import TENANT_ATTRIBUTE, extract
from services.connection.channel import Outbound
from services.queue.client import QueueEntry

tracer = trace.get_tracer("starling.connection")


def deliver_traced(
    ob: Outbound, e: QueueEntry, pid: int, dup: bool, now: float, *, client_id: str, queue_id: str
) -> bool:
    """Send entry `e` as packet `pid` inside its span; False when it was not sent (expired
    or too large)."""
    msg = e.message
    with tracer.start_as_current_span(
        "mqtt.deliver",
        context=extract(dict(msg.trace_context)),
        kind=SpanKind.CONSUMER,
        attributes={
            "mqtt.topic": msg.topic,
            TENANT_ATTRIBUTE: msg.tenant,
            "mqtt.client_id": client_id,
            "starling.queue": queue_id,
            "starling.seq": e.seq,
            "mqtt.dup": dup,
        },
    ) as span:
        sent = ob.deliver_stored(msg, msg.qos, msg.retain, e.subscription_ids, pid, dup, now)
        if not sent:
            span.set_attribute("starling.sent", False)
        return sent
