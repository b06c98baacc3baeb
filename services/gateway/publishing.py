"""Publishing: the gateway's publish flow, shared by the HTTP API and CoAP. A publish is
checked (the caller's ACL, then the tenant's rate quota) and goes into the mesh through
services/common/bus/publisher.py exactly as a node's does: QoS >= 1 and retained messages
through the router first (persistent sessions' queues, the retained store), then live on
the topic's NATS subject, and to the RULES stream when a rule reads the topic. So a message
from HTTP or CoAP is indistinguishable downstream from one a node took in.

All or nothing per call: every message of a bulk is checked before any is published (the
publishes of one event-loop turn then share one call into the mesh: batching.py), and a
call that returns has had every message kept (the answer's message ids) - the promise an MQTT
PUBACK makes. A router that answers TRY_LATER (a queue could not take it now) is asked again
with the same message ids (appends are idempotent by id) until `timeout_s`; a refusal by a
queue or retained quota, or no answer within `timeout_s`, is a `PublishRefusedError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace

from services.common.acl import AclChecker
from services.common.bus.publisher import NotKeptError, ServicePublisher
from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.message_size import message_bytes
from services.common.telemetry import TENANT_ATTRIBUTE, inject
from services.gateway.batching import PublishBatcher
from services.gateway.message_input import PublishItem
from services.gateway.stats import GatewayStats
from services.gateway.tenant_rates import TenantRates
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.gateway.publishing")
tracer = trace.get_tracer(__name__)

RETRY_S = 0.1  # between tries of a publish the router answered TRY_LATER


class PublishRefusedError(Exception):
    """Not published; `status` is the HTTP status (CoAP maps it), `retry_after_s` set for
    429."""

    def __init__(self, status: int, reason: str, retry_after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Publisher:
    """Who publishes: the tenant, the identity shown as the publisher, the ACL (None: an
    admin token, every topic of the tenant)."""

    tenant: str
    client_id: str
    acl: AclChecker | None


class Publishing:
    def __init__(
        self,
        *,
        publisher: ServicePublisher,
        rates: TenantRates,
        stats: GatewayStats,
        node_id: str,
        timeout_s: float,
        tracing: bool = False,
    ) -> None:
        """`tracing`: open each message's `mqtt.publish` span (sampled per tenant, as a
        node's), whose context travels in the envelope to the subscribers' nodes."""
        self._tracing = tracing
        self._publisher = publisher
        self._batcher = PublishBatcher(publish=publisher.publish_envelopes)
        self._rates = rates
        self._stats = stats
        self._node_id = node_id
        self._timeout_s = timeout_s

    async def publish(self, who: Publisher, items: Sequence[PublishItem]) -> list[str]:
        """Publish `items` as `who`; their message ids once every one is kept."""
        for i, item in enumerate(items):
            if who.acl is not None and not who.acl.can_publish(item.topic):
                where = f"[{i}]: " if len(items) > 1 else ""
                raise PublishRefusedError(403, f"{where}not authorized to publish {item.topic!r}")
        size = sum(message_bytes(item.topic, item.payload) for item in items)
        wait = await self._rates.take(who.tenant, len(items), size)
        if wait is not None:
            self._stats.refused_by_quota(who.tenant)
            raise PublishRefusedError(429, "the tenant's rate quota is spent", wait)
        envs = [self._envelope(who, item) for item in items]
        await self._keep(envs)
        for item in items:
            self._stats.published(who.tenant, item.qos, item.topic, item.payload)
        return [env.message_id for env in envs]

    async def close(self) -> None:
        await self._batcher.close()

    def _envelope(self, who: Publisher, item: PublishItem) -> RoutedMessage:
        now = time.time()
        msg = Message(
            who.tenant,
            item.topic,
            item.payload,
            item.qos,
            item.retain,
            publisher=item.client_id or who.client_id,
            properties=item.properties,
            expires_at=None if item.expiry_s is None else now + item.expiry_s,
            published_at=now,
        )
        env = to_envelope(msg, self._node_id, self._publisher.next_id())
        if item.delay_s:
            env.delay_s = item.delay_s
        if self._tracing:
            _start_trace(env, self._node_id)
        return env

    async def _keep(self, envs: list[RoutedMessage]) -> None:
        deadline = time.monotonic() + self._timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0.01)):  # no task, unlike wait_for
                    await self._batcher.publish(envs)
                return
            except NotKeptError as exc:
                result = str(exc).rsplit(": ", 1)[-1]
                if "QUOTA" in result:
                    raise PublishRefusedError(429, f"not kept: {result.lower()}", 1.0) from None
                if time.monotonic() + RETRY_S >= deadline:
                    raise PublishRefusedError(503, f"not kept: {result.lower()}") from None
            except TimeoutError:
                raise PublishRefusedError(503, "the router did not keep it in time") from None
            except Exception as exc:
                log.warning("publish_failed", extra={"error": type(exc).__name__})
                if time.monotonic() + RETRY_S >= deadline:
                    raise PublishRefusedError(503, "the router could not be reached") from None
            await asyncio.sleep(RETRY_S)


def _start_trace(env: RoutedMessage, node_id: str) -> None:
    """The message's `mqtt.publish` span, as a node opens it; a sampled one's context goes
    in the envelope (not sampled: none, so no later process opens a span for it)."""
    with tracer.start_as_current_span(
        "mqtt.publish",
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "mqtt.topic": env.topic,
            "starling.node": node_id,
            TENANT_ATTRIBUTE: env.tenant,  # the sampler decides by tenant
            "mqtt.qos": env.qos,
        },
    ) as span:
        if span.is_recording():
            env.trace_context.update(inject())
