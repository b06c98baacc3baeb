"""Thin gRPC servicers of the queue service: requests translated to the append flow
(appending.py) and the readers' side (consuming.py), their answers back to protobuf."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
from nats.aio.client import Client
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from services.common.limits_copies import LimitsCopies
from services.common.refusals import Refusals
from services.common.rpc.errors import InvalidArgumentError
from services.common.store.ports_queue import NewQueueItem, QueueStore
from services.common.telemetry import TENANT_ATTRIBUTE, message_spans
from services.queue.appending import AppendDeps, Appending, EntryResult
from services.queue.config import QueueSettings
from services.queue.consuming import Consuming, Renewal
from services.queue.core import RouteVersions, expires_at_ms
from services.queue.depths import QueueDepths
from services.queue.link import CURRENT_LINK
from services.queue.notices import Notices
from services.queue.ownership import Partitions
from services.queue.readers import Readers
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

tracer = trace.get_tracer("starling.queue")

_RESULT = {
    EntryResult.STORED: pb.APPEND_RESULT_OK,
    EntryResult.FENCED: pb.APPEND_RESULT_FENCED,
    EntryResult.QUEUE_FULL: pb.APPEND_RESULT_QUEUE_FULL,
    EntryResult.QUOTA_EXCEEDED: pb.APPEND_RESULT_QUOTA_EXCEEDED,
}


def _items_by_queue(
    entries: Iterable[pb.NewEntry],
) -> tuple[dict[str, list[int]], dict[str, list[NewQueueItem]]]:
    """Validate the entries and group them by queue: each queue's entries' indexes in the
    request (so results can be put back in request order), and their stored forms."""
    positions: dict[str, list[int]] = {}
    items: dict[str, list[NewQueueItem]] = {}
    for i, e in enumerate(entries):
        if not e.queue_id or not e.message.message_id:
            raise InvalidArgumentError(f"entries[{i}] needs queue_id and message.message_id")
        qid = e.queue_id
        if qid in items:
            positions[qid].append(i)
            items[qid].append(_new_item(e))
        else:
            positions[qid] = [i]
            items[qid] = [_new_item(e)]
    return positions, items


def _new_item(e: pb.NewEntry) -> NewQueueItem:
    """The stored form of an entry: the serialized QueueEntry, with its expiry time.

    NewEntry and QueueEntry share field numbers and types 2 to 5 (message, qos, retain,
    subscription_identifiers; tests/queue/test_entry_wire.py holds them to it), and QueueEntry's
    field 1 (seq) is set when an entry is read. So the NewEntry as received, without its
    queue_id (field 1), serialized, is the QueueEntry: no new message with a copy of the
    RoutedMessage to build (measured: a quarter of the cost per entry)."""
    m = e.message
    expiry = (
        m.properties.message_expiry_interval_s
        if m.properties.HasField("message_expiry_interval_s")
        else None
    )
    qid = e.queue_id
    e.ClearField("queue_id")
    data = e.SerializeToString()
    e.queue_id = qid
    return NewQueueItem(
        m.message_id,
        e.qos,
        data,
        expires_at_ms(m.published_at_ms, expiry),
    )


def _end_spans(spans: Sequence[tuple[int, Span]], results: list[pb.AppendResult.ValueType]) -> None:
    for i, span in spans:
        span.set_attribute("starling.append_result", pb.AppendResult.Name(results[i]))
        span.end()


class QueueApi(pb_grpc.QueueServiceServicer):
    """The queue service, served on gRPC, NATS and the queue link (main.py); it builds the
    domain objects and holds what main.py reports (`refusals`, `depths`, `dropped_by_tenant`)."""

    def __init__(
        self,
        *,
        store: QueueStore,
        parts: Partitions,
        settings: QueueSettings,
        nats: Client,
        readers: Readers,
        depths: QueueDepths,
        limits: LimitsCopies | None = None,
    ) -> None:
        """`readers`, `depths`: those `parts` forgets when it loses partitions (main.py);
        `limits`: tenants' max_queue_depth and max_queued_bytes (quota service); None: only
        the settings apply."""
        self.refusals = Refusals()
        self.routes = RouteVersions()
        # Entries waiting per tenant in this instance's partitions (reported to metrics).
        self.depths = depths
        self._notices = Notices(nats=nats)
        deps = AppendDeps(
            store=store,
            parts=parts,
            readers=readers,
            depths=self.depths,
            notices=self._notices,
            refusals=self.refusals,
            limits=limits,
        )
        self._appending = Appending(deps=deps, settings=settings)
        self._consuming = Consuming(
            store=store,
            parts=parts,
            readers=readers,
            depths=self.depths,
            announce=self._notices.again,
        )
        self._parts = parts
        # No message carries a trace context unless some process samples (the same settings
        # on every service): then no per-entry look for one.
        self._tracing = settings.tracing

    @property
    def dropped_by_tenant(self) -> dict[str, int]:
        """Entries dropped by the depth limit per tenant since start (reported to metrics)."""
        return self._notices.dropped_by_tenant

    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        if not request.tenant:
            raise InvalidArgumentError("tenant is required")
        tenant = request.tenant
        if request.routes_checked and not self.routes.current(tenant, request.routes_checked):
            return pb.AppendResponse(stale_routes=True)
        if request.routes_current:
            self.routes.learn(tenant, request.routes_current)
        if not request.entries:  # a node's copy confirmed: no persistent subscriber matches
            return pb.AppendResponse()
        positions, items = _items_by_queue(request.entries)
        results = [pb.APPEND_RESULT_UNSPECIFIED] * len(request.entries)
        spans = self._spans(tenant, request.entries)
        try:
            by_queue = await self._appending.append(tenant, items)
            for indexes, queue_results in zip(positions.values(), by_queue, strict=True):
                for i, r in zip(indexes, queue_results, strict=True):
                    results[i] = _RESULT[r]
        finally:
            _end_spans(spans, results)
        return pb.AppendResponse(results=results)

    def _spans(self, tenant: str, entries: Sequence[pb.NewEntry]) -> list[tuple[int, Span]]:
        """A span per entry whose message was sampled where it was published (it carries its
        trace context), with the entry's index."""
        if not self._tracing:
            return []
        traced = [(i, e) for i, e in enumerate(entries) if e.message.trace_context]
        spans = message_spans(
            tracer,
            "queue.append",
            (
                (e.message.trace_context, {TENANT_ATTRIBUTE: tenant, "starling.queue": e.queue_id})
                for _, e in traced
            ),
            SpanKind.SERVER,
        )
        return [(i, span) for (i, _), span in zip(traced, spans, strict=True)]

    async def DirectAppend(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        """A connection node's append (NATS svc.queue.direct): always checked against the
        route version, and a node cannot teach the queue one."""
        if not request.routes_checked:
            raise InvalidArgumentError("routes_checked is required")
        request.routes_current = 0
        return await self.Append(request, context)

    async def FenceRoutes(
        self, request: pb.FenceRoutesRequest, context: grpc.aio.ServicerContext
    ) -> pb.FenceRoutesResponse:
        """The router is about to change a tenant's route table (services/queue/core.py
        RouteVersions says why)."""
        if not request.tenant or not request.version:
            raise InvalidArgumentError("tenant and version are required")
        return pb.FenceRoutesResponse(
            version=self.routes.learn(request.tenant, request.version),
            instance_ordinal=self._parts.index,
            instance_count=self._parts.instances,
            instance_id=self._parts.instance_id,
        )

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadResponse:
        batch = await self._consuming.read(
            request.tenant,
            request.queue_id,
            request.from_seq,
            request.limit,
            mark_delivered=request.mark_delivered,
            reader=request.reader,
            link=CURRENT_LINK.get(),
        )
        resp = pb.ReadResponse(
            acked_through=batch.acked_through,
            last_seq=batch.last_seq,
            delivered_through=batch.delivered_through,
        )
        add = resp.entries.add
        for e in batch.entries:
            # In place, the stored fields merged in (see _new_item): no entry to copy.
            add(seq=e.seq, expires_at_ms=e.expires_at_ms, released=e.released).MergeFromString(
                e.data
            )
        return resp

    async def Ack(
        self, request: pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckResponse:
        renew = (
            Renewal(reader=request.reader, room=request.room, seen_through=request.seen_through)
            if request.reader
            else None
        )
        await self._consuming.ack(
            request.tenant,
            request.queue_id,
            request.through_seq,
            detach_reader=request.detach_reader,
            renew=renew,
            link=CURRENT_LINK.get(),
            seqs=request.seqs,
        )
        return pb.AckResponse()

    async def MarkReleased(
        self, request: pb.MarkReleasedRequest, context: grpc.aio.ServicerContext
    ) -> pb.MarkReleasedResponse:
        seqs = [request.seq, *request.seqs] if request.seq else list(request.seqs)
        await self._consuming.mark_released(request.tenant, request.queue_id, seqs)
        return pb.MarkReleasedResponse()

    async def Drop(
        self, request: pb.DropRequest, context: grpc.aio.ServicerContext
    ) -> pb.DropResponse:
        await self._consuming.drop(request.tenant, request.queue_id)
        return pb.DropResponse()


class QueueAdminApi(pb_grpc.QueueAdminServiceServicer):
    def __init__(self, store: QueueStore) -> None:
        self._store = store

    async def GetQueueStats(
        self, request: pb.GetQueueStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueStatsResponse:
        st = await self._store.state(request.tenant, request.queue_id)
        return pb.GetQueueStatsResponse(
            depth=st.depth, last_seq=st.last_seq, acked_through=st.acked_through, dropped=st.dropped
        )
