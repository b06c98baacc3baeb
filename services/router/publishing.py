"""What the router does with a publish from a node: a delayed one waits
(services/router/delaying.py), a retained one is stored (services/router/retaining.py), and
a QoS>=1 one goes to every matching persistent session's queue, traced when it carries a
trace context.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.common.route_table import RouteResult, RouteTable, plan, settle
from services.common.rpc.errors import ServiceError
from services.common.telemetry import TENANT_ATTRIBUTE, message_spans
from services.common.topics.delayed import parse_delayed
from services.queue.client import AppendResult, QueueClient, StaleRoutesError
from services.router.delaying import DelayedMessages
from services.router.fencing import RouteFence
from services.router.retaining import Retaining
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.router")
tracer = trace.get_tracer("starling.router")
# Several instances: appends refused as stale this often in a row make the batch TRY_LATER.
_CHECKS = 3


class Publisher:
    """Call `accept` with each batch a node sends (and each delayed message when due)."""

    def __init__(
        self,
        *,
        table: RouteTable,
        queues: QueueClient,
        fence: RouteFence,
        retaining: Retaining,
        delayed: DelayedMessages,
        include_qos0: bool,
        tracing: bool = True,
        several_instances: bool = False,
    ) -> None:
        self._table = table
        self._queues = queues
        self._fence = fence
        self._retaining = retaining
        self._delayed = delayed
        self._qos0 = include_qos0  # QoS 0 queued for offline persistent sessions too
        # With no sampling anywhere no message carries a trace context, so none is looked for.
        self._tracing = tracing
        # Several router instances (services/router/cluster.py): appends checked by version.
        self._checked = several_instances

    async def accept(self, messages: list[RoutedMessage]) -> tuple[list[RouteResult], int]:
        """Handle publishes from a node; one RouteResult per message, and queues touched."""
        results = [RouteResult.NO_MATCH] * len(messages)
        to_route: list[tuple[int, RoutedMessage]] = []
        for i, m in enumerate(messages):
            if m.delay_s:  # a will with a delay: held until due or settled
                held = RoutedMessage()
                held.CopyFrom(m)
                held.delay_s = 0
                await self._delayed.delay_will(held, m.delay_s)
                results[i] = RouteResult.STORED
                continue
            delayed = parse_delayed(m.topic)
            if delayed is not None:
                stored = await self._delayed.delay(m, delayed)
                results[i] = RouteResult.STORED if stored else RouteResult.QUOTA_EXCEEDED
                continue
            if m.retain and not await self._retaining.retain(m):
                results[i] = RouteResult.QUOTA_EXCEEDED
            to_route.append((i, m))
        # Messages sampled where they were published carry their trace context.
        traced = [(i, m) for i, m in to_route if m.trace_context] if self._tracing else []
        spans = message_spans(
            tracer,
            "router.route",
            (
                (m.trace_context, {TENANT_ATTRIBUTE: m.tenant, "mqtt.topic": m.topic})
                for _, m in traced
            ),
            SpanKind.SERVER,
        )
        try:
            queues = await self._route(to_route, results)
        finally:
            for span, (i, _) in zip(spans, traced, strict=True):
                span.set_attribute("starling.route_result", RouteResult(results[i]).name)
                span.end()
        return results, queues

    async def _route(
        self, items: list[tuple[int, RoutedMessage]], results: list[RouteResult]
    ) -> int:
        if self._checked:
            by_tenant: dict[str, list[tuple[int, RoutedMessage]]] = {}
            for i, m in items:
                by_tenant.setdefault(m.tenant, []).append((i, m))
            routed = 0
            for tenant, group in by_tenant.items():
                routed += await self._route_checked(tenant, group, results)
            return routed
        queues = 0
        for tenant, (entries, owners) in plan(self._table, items, self._qos0).items():
            outcomes: list[AppendResult | None]
            try:
                outcomes = list(
                    await self._queues.append(
                        tenant, entries, routes_current=self._fence.version(tenant)
                    )
                )
            except ServiceError as exc:
                log.warning("queue_append_failed", extra={"code": exc.code.name})
                outcomes = [None] * len(entries)  # nothing known to be stored
            settle(results, owners, outcomes)
            queues += len(entries)
        return queues

    async def _route_checked(
        self, tenant: str, items: list[tuple[int, RoutedMessage]], results: list[RouteResult]
    ) -> int:
        """Several instances: route from our table as a node's copy does, checked by the
        queue against the version every queue holds (even with no entries: that answer is
        what says no persistent session matches); refused, catch up and route again."""
        for _ in range(_CHECKS):
            try:
                version = await self._fence.routing_version(tenant)
                entries, owners = plan(self._table, items, self._qos0).get(tenant, ([], []))
                outcomes: list[AppendResult | None] = list(
                    await self._queues.append(tenant, entries, routes_checked=version)
                )
            except StaleRoutesError:
                try:
                    await self._fence.catch_up(tenant, version)
                except Exception:  # the queues unreachable: the node retries the batch
                    log.warning("route_catch_up_failed", extra={"tenant": tenant})
                    break
                continue
            except ServiceError as exc:
                log.warning("queue_append_failed", extra={"code": exc.code.name})
                entries, owners, outcomes = [], [i for i, _ in items], [None] * len(items)
            except RuntimeError:  # the version kept moving
                break
            settle(results, owners, outcomes)
            return len(entries)
        for i, _ in items:
            results[i] = RouteResult.TRY_LATER
        return 0
