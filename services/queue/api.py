"""Thin gRPC servicers of the queue service."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable
from contextlib import AsyncExitStack
from typing import Any

import grpc
from nats.aio.client import Client
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.common.bus import subjects
from services.common.limits_copies import LimitsCopies
from services.common.log_summary import LogSummary
from services.common.refusals import Refusals
from services.common.rpc.errors import InvalidArgumentError
from services.common.rpc.limits import BATCH_BYTES
from services.common.store.ports import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueStore,
)
from services.common.telemetry import TENANT_ATTRIBUTE, message_spans
from services.queue.config import QueueSettings
from services.queue.core import RouteVersions, expires_at_ms, partition_of
from services.queue.depths import QueueDepths
from services.queue.link import CURRENT_LINK
from services.queue.ownership import Partitions
from services.queue.readers import Lease, Readers
from starling.common.v1 import event_pb2
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

log = logging.getLogger("starling.queue")
tracer = trace.get_tracer("starling.queue")

# An entry the tenant's max_queue_depth refused (the store's FULL, under the quota's cap).
_QUOTA_REFUSED = "quota_refused"

_RESULT = {
    AppendOutcome.OK: pb.APPEND_RESULT_OK,
    AppendOutcome.DUPLICATE: pb.APPEND_RESULT_OK,  # already stored: the caller may go on
    AppendOutcome.FULL: pb.APPEND_RESULT_QUEUE_FULL,
    AppendOutcome.FENCED: pb.APPEND_RESULT_FENCED,
    _QUOTA_REFUSED: pb.APPEND_RESULT_QUOTA_EXCEEDED,
    AppendOutcome.OVER_BYTES: pb.APPEND_RESULT_QUOTA_EXCEEDED,
}


@dataclasses.dataclass(frozen=True, slots=True)
class _Caps:
    """What one append request may do: the depth cap and policy, whether the cap is the
    tenant's quota, and the tenant's max_queued_bytes (0: none)."""

    depth: int
    drop_oldest: bool
    quota: bool
    queued_bytes: int = 0


def _items_by_queue(
    entries: Iterable[pb.NewEntry],
) -> dict[str, list[tuple[int, NewQueueItem]]]:
    """Validate the entries and group them by queue, each with its index in the request (so
    results can be put back in request order)."""
    by_queue: dict[str, list[tuple[int, NewQueueItem]]] = defaultdict(list)
    for i, e in enumerate(entries):
        if not e.queue_id or not e.message.message_id:
            raise InvalidArgumentError(f"entries[{i}] needs queue_id and message.message_id")
        by_queue[e.queue_id].append((i, _new_item(e)))
    return by_queue


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


def _push(
    notice: pb.QueueNotice,
    reader: str,
    items: list[tuple[int, NewQueueItem]],
    report: AppendReport,
) -> None:
    """Put the entries this append stored (OK outcomes: consecutive seqs ending at last_seq)
    into `notice`, for `reader`."""
    stored = [
        it for (_, it), o in zip(items, report.outcomes, strict=True) if o == AppendOutcome.OK
    ]
    notice.reader = reader
    add = notice.entries.add
    for seq, it in enumerate(stored, start=report.last_seq - len(stored) + 1):
        # The stored form lacks exactly these fields (see _new_item): merged, not rebuilt.
        add(seq=seq, expires_at_ms=it.expires_at_ms).MergeFromString(it.data)


class QueueApi(pb_grpc.QueueServiceServicer):
    def __init__(
        self,
        store: QueueStore,
        parts: Partitions,
        settings: QueueSettings,
        nats: Client,
        limits: LimitsCopies | None = None,
    ) -> None:
        self._store = store
        # Tenants' max_queue_depth (quota service); None: only the setting applies.
        self._limits = limits
        self.refusals = Refusals()
        # Refused appends can come per publish: the log gets a line per tenant per 10 s.
        self._refused_log = LogSummary(log, "queue_quota_refused")
        self._parts = parts
        self._max_depth = settings.max_queue_depth
        self._drop_oldest = settings.depth_policy == "drop_oldest"
        self._nats = nats
        self._push_max_bytes = settings.notice_max_bytes
        # Entries dropped by the depth limit per tenant since start (reported to metrics).
        self.dropped_by_tenant: dict[str, int] = {}
        # No message carries a trace context unless some process samples (the same settings
        # on every service): then no per-entry look for one.
        self._tracing = settings.tracing
        # Other instances' byte figures older than three of their periods are forgotten.
        self._peers_ttl_s = 3 * settings.queued_bytes_share_s
        self.readers = Readers()
        self.routes = RouteVersions()
        # Entries waiting per tenant in this instance's partitions (reported to metrics).
        self.depths = QueueDepths(parts.count, lambda: parts.epochs.keys())
        parts.on_lost = self._lost

    def _lost(self, lost: set[int]) -> None:
        # Readers move with their queue's owner: the partitions' new owner starts afresh.
        self.readers.drop_partitions(lost, self._parts.count)
        self.depths.lost(lost)

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
        by_queue = _items_by_queue(request.entries)
        results = [pb.APPEND_RESULT_UNSPECIFIED] * len(request.entries)
        # Messages sampled where they were published carry their trace context.
        traced = (
            [(i, e) for i, e in enumerate(request.entries) if e.message.trace_context]
            if self._tracing
            else []
        )
        spans = message_spans(
            tracer,
            "queue.append",
            (
                (e.message.trace_context, {TENANT_ATTRIBUTE: tenant, "starling.queue": e.queue_id})
                for _, e in traced
            ),
            SpanKind.SERVER,
        )
        try:
            pushes = {qid: self._push_to(tenant, qid, items) for qid, items in by_queue.items()}
            try:
                reports = await self._append_to_queues(tenant, by_queue, pushes)
            except BaseException:
                self._settle_pushes(by_queue, pushes, None)
                raise
            self._settle_pushes(by_queue, pushes, reports)  # before any await below
            for (qid, items), report in zip(by_queue.items(), reports, strict=True):
                for (i, _), outcome in zip(items, report.outcomes, strict=True):
                    results[i] = _RESULT[outcome]
                lease = pushes[qid]
                # Pushed only if the lease is still the one the append marked for: a reader that
                # took the queue over meanwhile reads the entries (they were sent to no one).
                pushed = lease is not None and lease is self.readers.get(tenant, qid)
                await self._announce(tenant, qid, report, items if pushed else None, lease)
        finally:
            for span, (i, _) in zip(spans, traced, strict=True):
                span.set_attribute("starling.append_result", pb.AppendResult.Name(results[i]))
                span.end()
        return pb.AppendResponse(results=results)

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

    def _settle_pushes(
        self,
        by_queue: dict[str, list[tuple[int, NewQueueItem]]],
        pushes: dict[str, Lease | None],
        reports: list[AppendReport] | None,
    ) -> None:
        """The credit `_push_to` reserved for each queue's entries is settled: pushed
        through the append's last seq, or (`reports` None: the append failed) given back, the
        reader sent to read first: some queues' entries may be stored, marked delivered, all
        the same, and were never pushed."""
        for i, (qid, lease) in enumerate(pushes.items()):
            if lease is None:
                continue
            if reports is None:
                self.readers.pushed(lease, len(by_queue[qid]), 0)
                self.readers.missed(lease)
            else:
                self.readers.pushed(lease, len(by_queue[qid]), reports[i].last_seq)

    def _push_to(
        self, tenant: str, qid: str, items: list[tuple[int, NewQueueItem]]
    ) -> Lease | None:
        """The caught-up reader to push this append's entries to, if they are small enough
        and it has room for them."""
        if not self._push_max_bytes:
            return None
        if sum(len(it.data) for _, it in items) > self._push_max_bytes:
            lease = self.readers.get(tenant, qid)
            if lease is not None:
                self.readers.missed(lease)  # it reads these back before any push
            return None
        return self.readers.push(tenant, qid, len(items))

    async def _append_to_queues(
        self,
        tenant: str,
        by_queue: dict[str, list[tuple[int, NewQueueItem]]],
        pushes: dict[str, Lease | None],
    ) -> list[AppendReport]:
        """Append to every queue of a request at once, so the store can commit them together
        (one fsync for the request instead of one per queue). The partitions' locks (one
        writer per partition) are taken in partition order, so two requests never deadlock."""
        parts = sorted({partition_of(tenant, qid, self._parts.count) for qid in by_queue})
        caps = _Caps(self._max_depth, self._drop_oldest, False)
        if self._limits is not None:
            limits = (await self._limits.fetch(tenant)).limits
            cap = limits.max_queue_depth
            if cap and (not caps.depth or cap < caps.depth):
                # The tenant's quota binds: refused, never dropped, so the publisher learns
                # (0x97) that a subscriber did not get it; no older entry is lost for it.
                caps = _Caps(cap, False, True)
            if limits.max_queued_bytes:
                caps = dataclasses.replace(caps, queued_bytes=limits.max_queued_bytes)

        def appends() -> list[Coroutine[Any, Any, AppendReport]]:
            return [
                self._append_to_queue(
                    tenant,
                    qid,
                    [it for _, it in items],
                    pushes[qid] is not None,
                    caps,
                )
                for qid, items in by_queue.items()
            ]

        if len(parts) == 1:  # one partition (the usual case): no AsyncExitStack
            async with self._parts.locks[parts[0]]:
                one = appends()
                # One queue: no task (and loop turn) of its own for it.
                return [await one[0]] if len(one) == 1 else list(await asyncio.gather(*one))
        async with AsyncExitStack() as stack:
            for p in parts:
                await stack.enter_async_context(self._parts.locks[p])
            return list(await asyncio.gather(*appends()))

    async def _append_to_queue(
        self,
        tenant: str,
        qid: str,
        items: list[NewQueueItem],
        push: bool,
        caps: _Caps,
    ) -> AppendReport:
        """Append to one queue under its partition's epoch (the caller holds the partition's
        lock); every item is FENCED when this instance does not (or no longer) own the
        partition. `push`: the new entries go to a reader in the notice, so the same
        transaction marks them delivered."""
        p = partition_of(tenant, qid, self._parts.count)
        epoch = self._parts.epochs.get(p)
        if epoch is None:
            return AppendReport([AppendOutcome.FENCED] * len(items))
        report = AppendReport([])
        room: int | None = None
        size = 0
        if caps.queued_bytes:
            try:
                await self.depths.load(self._store, p)  # a partition just gained
            except Exception as exc:  # the store is away: the append itself will tell
                log.warning("queue_depth_scan_failed", extra={"error": repr(exc)})
            # Taken with no await before the store call: the appends of one request (and
            # concurrent ones) see each other's reservations, so together they stay within
            # the room.
            room = max(0, caps.queued_bytes - self.depths.held_bytes(tenant, self._peers_ttl_s))
            size = sum(len(it.data) for it in items)
            self.depths.reserve(tenant, size)
        self.depths.begin(p)
        try:
            report = await self._store.append(
                tenant,
                qid,
                items,
                p,
                epoch,
                caps.depth,
                caps.drop_oldest,
                mark_delivered=push,
                room_bytes=room,
            )
        finally:
            self.depths.end(p, tenant, QueueChange(report.depth_change, report.bytes_change))
            if size:
                self.depths.reserve(tenant, -size)
        if AppendOutcome.FENCED in report.outcomes:
            self._parts.fenced(p)  # another instance took the partition over
        over = report.outcomes.count(AppendOutcome.OVER_BYTES)
        if over:
            self.refusals.count("max_queued_bytes", tenant, over)
            self._refused_log.add(tenant, over, qid)
        if caps.quota and AppendOutcome.FULL in report.outcomes:
            refused = report.outcomes.count(AppendOutcome.FULL)
            self.refusals.count("max_queue_depth", tenant, refused)
            self._refused_log.add(tenant, refused, qid)
            # Refused, not dropped: the publisher is told (no drop event, no drop count).
            report = dataclasses.replace(report, dropped=0)
            report.outcomes[:] = [
                _QUOTA_REFUSED if o == AppendOutcome.FULL else o for o in report.outcomes
            ]
        return report

    async def _announce(
        self,
        tenant: str,
        qid: str,
        report: AppendReport,
        pushed: list[tuple[int, NewQueueItem]] | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Tell the queue's readers about new entries (a notice on NATS, carrying the
        `pushed` entries for the `lease`'s reader), and report drops."""
        if AppendOutcome.OK in report.outcomes:
            notice = pb.QueueNotice(tenant=tenant, queue_id=qid, last_seq=report.last_seq)
            link = None
            if pushed is not None and lease is not None:
                _push(notice, lease.reader, pushed, report)
                link = lease.link
            data = notice.SerializeToString()
            if link is None or not link.notice(data):
                await self._nats.publish(subjects.queue_notice(tenant, qid), data)
        if report.dropped:
            await self._dropped(tenant, qid, report.dropped)

    async def _dropped(self, tenant: str, qid: str, count: int) -> None:
        """Depth limit hit: counted in the queue state and per tenant (the stats report),
        and an event on EVENTS."""
        self.dropped_by_tenant[tenant] = self.dropped_by_tenant.get(tenant, 0) + count
        log.warning("queue_depth_drop", extra={"tenant": tenant, "queue_id": qid, "count": count})
        ev = event_pb2.Event(
            tenant=tenant,
            type=event_pb2.EVENT_TYPE_MESSAGE_DROPPED,
            ts_ms=int(time.time() * 1000),
            client_id=qid.rsplit("#", 1)[0],
            message_dropped=event_pb2.MessageDropped(reason="queue_depth_limit", count=count),
        )
        await self._nats.publish(subjects.event(tenant, "message_dropped"), ev.SerializeToString())

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadResponse:
        limit = min(request.limit or 100, 10_000)
        reader = request.reader if request.mark_delivered else ""
        # Capped by bytes as well as count, so the answer fits the gRPC limit and the
        # queue's memory stays bounded; the first entry always comes (a big one still moves).
        entries, st = await self._store.read(
            request.tenant,
            request.queue_id,
            max(1, request.from_seq),
            limit,
            mark_delivered=request.mark_delivered,
            max_bytes=BATCH_BYTES,
        )
        now_ms = int(time.time() * 1000)
        resp = pb.ReadResponse(acked_through=st.acked_through)
        add = resp.entries.add
        for e in entries:
            if e.expires_at_ms and e.expires_at_ms <= now_ms:
                continue  # expired: never delivered; the reader's ack passes over it
            # In place, the stored fields merged in (see _new_item): no entry to copy.
            add(seq=e.seq, expires_at_ms=e.expires_at_ms, released=e.released).MergeFromString(
                e.data
            )
        # last_seq: the last seq this read looked at, so the reader continues after entries
        # it was not given (expired ones).
        scanned = entries[-1].seq if entries else max(request.from_seq - 1, 0)
        delivered = st.delivered_through  # as it was before this read
        # Only the owner keeps readers (it pushes to them); another instance serves a read
        # from the store alone (a caller whose ownership map is behind).
        if reader and self._parts.owns(
            partition_of(request.tenant, request.queue_id, self._parts.count)
        ):
            delivered = self.readers.delivered_before(
                request.tenant, request.queue_id, reader, delivered
            )
            self.readers.read(
                request.tenant,
                request.queue_id,
                reader,
                scanned,
                scanned >= st.last_seq,
                room=limit - len(entries),
                mark=delivered,
            )
            self._note_link(request.tenant, request.queue_id, reader)
        resp.last_seq = scanned
        resp.delivered_through = delivered
        return resp

    async def Ack(
        self, request: pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckResponse:
        if request.detach_reader:
            self.readers.detach(request.tenant, request.queue_id, request.detach_reader)
        elif request.reader:  # before any await: a Read sent after this Ack sets it later
            self.readers.renew(
                request.tenant,
                request.queue_id,
                request.reader,
                request.room,
                request.seen_through,
            )
            self._note_link(request.tenant, request.queue_id, request.reader)
        if request.through_seq:
            p = self.depths.partition(request.tenant, request.queue_id)
            change = QueueChange()
            self.depths.begin(p)
            try:
                change = await self._store.ack(
                    request.tenant, request.queue_id, request.through_seq
                )
            finally:
                self.depths.end(p, request.tenant, change)
        return pb.AckResponse()

    def _note_link(self, tenant: str, queue_id: str, reader: str) -> None:
        """The call being served (a Read or a renewing Ack by `reader`) came on a queue link,
        or not: if `reader` holds the queue's lease, its pushes follow that way."""
        lease = self.readers.get(tenant, queue_id)
        if lease is not None and lease.reader == reader:
            lease.link = CURRENT_LINK.get()

    async def MarkReleased(
        self, request: pb.MarkReleasedRequest, context: grpc.aio.ServicerContext
    ) -> pb.MarkReleasedResponse:
        seqs = [request.seq, *request.seqs] if request.seq else list(request.seqs)
        # Together: the embedded store commits them in one transaction (group commit).
        await asyncio.gather(
            *(self._store.mark_released(request.tenant, request.queue_id, s) for s in seqs)
        )
        return pb.MarkReleasedResponse()

    async def Drop(
        self, request: pb.DropRequest, context: grpc.aio.ServicerContext
    ) -> pb.DropResponse:
        self.readers.drop(request.tenant, request.queue_id)
        p = self.depths.partition(request.tenant, request.queue_id)
        change = QueueChange()
        self.depths.begin(p)
        try:
            change = await self._store.drop(request.tenant, request.queue_id)
        finally:
            self.depths.end(p, request.tenant, change)
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
