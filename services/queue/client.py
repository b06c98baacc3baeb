"""Typed clients of the queue service: `QueueClient` for the router (append), the session
service (drop) and connection nodes (read, ack, mark_released); `QueueAdminClient` for
operators. The append's fan-out to the queues' owners, and its types (`NewEntry`,
`AppendResult`, `StaleRoutesError`, exported here), are append_client.py's.

Entries come back as `Message`s that already carry the delivery QoS, retain flag and expiry of
their queue entry: callers never see the queue's protobuf.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.message import Message as ProtoMessage
from nats.aio.client import Client

from services.common.bus import unary
from services.common.bus.unary import (
    ACK_SUBJECT,
    FENCE_ROUTES_SUBJECT,
    READ_SUBJECT,
    RELEASED_SUBJECT,
)
from services.common.envelope import from_envelope
from services.common.message import Message
from services.common.queue_entries import queue_id
from services.common.rpc.client import LazyStub
from services.common.rpc.errors import UnavailableError
from services.queue.append_client import AppendFanOut, AppendResult, NewEntry, StaleRoutesError
from services.queue.owner_calls import OwnerCalls, Stub
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc

R = TypeVar("R", bound=ProtoMessage)

__all__ = [
    "AppendResult",
    "NewEntry",
    "Notice",
    "QueueAdminClient",
    "QueueClient",
    "QueueEntry",
    "QueueRead",
    "QueueStats",
    "StaleRoutesError",
    "queue_id",
]


@dataclass(frozen=True, slots=True)
class QueueEntry:
    seq: int
    message: Message  # with the entry's qos, retain and expires_at
    subscription_ids: tuple[int, ...]
    released: bool  # the client sent PUBREC: resend PUBREL, not the PUBLISH


@dataclass(frozen=True, slots=True)
class QueueRead:
    entries: tuple[QueueEntry, ...]
    acked_through: int
    last_seq: int  # the last seq examined (expired entries are skipped): go on from + 1
    # The highest seq handed to a connection before this read: entries at or below it may
    # have been sent already (DUP=1), entries above it never were (DUP=0).
    delivered_through: int = 0


@dataclass(frozen=True, slots=True)
class Notice:
    """A queue's announcement of new entries (seqs through `last_seq`), with the entries it
    pushed for `reader` only (services/queue/readers.py): `pushed` of them, the first at
    `first_seq`. `entries()` decodes them; a reader that cannot take them never pays for it."""

    last_seq: int
    reader: str = ""
    first_seq: int = 0
    pushed: int = 0
    raw: Sequence[pb.QueueEntry] = ()
    dropped: bool = False  # a durable shared group's queue was dropped

    def entries(self) -> tuple[QueueEntry, ...]:
        return tuple(_entry_from_pb(e) for e in self.raw)


def parse_notice(data: bytes) -> Notice:
    """A QueueNotice as published on NATS (qn.<tenant>.<queue_id>)."""
    n = pb.QueueNotice.FromString(data)
    first = n.entries[0].seq if n.entries else 0
    return Notice(n.last_seq, n.reader, first, len(n.entries), n.entries, n.dropped)


@dataclass(frozen=True, slots=True)
class QueueStats:
    depth: int
    last_seq: int
    acked_through: int
    dropped: int


def _entry_from_pb(e: pb.QueueEntry) -> QueueEntry:
    sids = e.subscription_identifiers
    return QueueEntry(
        e.seq,
        from_envelope(e.message, e.qos, e.retain, e.expires_at_ms),
        tuple(sids) if sids else (),
        e.released,
    )


class QueueClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.QueueServiceStub, timeout_s=timeout_s)
        self._calls = OwnerCalls(rpc=self._rpc, timeout_s=timeout_s, on_notice=self._on_link_notice)
        self._appends = AppendFanOut(calls=self._calls)
        # Readers (persistent deliveries) that take the notices pushed to them on a queue link.
        self._listeners: dict[str, Callable[[Notice], None]] = {}

    def listen(self, reader: str, on_notice: Callable[[Notice], None]) -> None:
        """Hand the notices pushed to `reader` on a queue link to `on_notice` (the others
        come on NATS, where the reader subscribes as well)."""
        self._listeners[reader] = on_notice

    def unlisten(self, reader: str) -> None:
        self._listeners.pop(reader, None)

    @property
    def generation(self) -> int:
        """Moves whenever a notice may have been lost on the way (an owner changed, a queue
        link opened or broke, `changed` was called): a reader that sees it move reads."""
        return self._calls.generation

    def changed(self) -> None:
        """Notices may have been lost (e.g. the NATS connection they come on reconnected)."""
        self._calls.changed()

    def _on_link_notice(self, data: bytes) -> None:
        notice = parse_notice(data)
        listener = self._listeners.get(notice.reader)
        if listener is not None:
            listener(notice)

    def use_bus(self, nc: Client) -> None:
        """Send append, read, ack and mark_released over NATS request/reply from now on
        (gRPC for what does not fit one NATS message), each to the owner of its queue's
        partition: services/common/bus/unary.py and services/queue/owner_calls.py say why."""
        self._calls.use_bus(nc)

    async def _call(
        self,
        tenant: str,
        queue_id: str,
        subject: str,
        method: Callable[[Stub], Callable[..., Awaitable[R]]],
        req: ProtoMessage,
        reply: type[R],
    ) -> R:
        """A call about one queue, at its owner; if that instance is gone, at any instance
        (each serves reads, acks and released marks from the store; only the owner keeps
        readers, which costs the reader a read where a push would have come)."""
        calls = self._calls
        if calls.bus is None:
            return await unary.call(None, subject, self._rpc, method(self._rpc), req, reply)
        await calls.follow()
        owner = calls.owners.owner(tenant, queue_id)
        try:
            return await calls.call(owner, ((tenant, queue_id),), subject, method, req, reply)
        except UnavailableError:
            if owner is None:
                raise
            return await calls.call(None, (), subject, method, req, reply)

    async def append(
        self,
        tenant: str,
        entries: Sequence[NewEntry],
        routes_checked: int = 0,
        routes_current: int = 0,
    ) -> list[AppendResult]:
        """One result per entry, in order.

        Each queue's entries go to the owner of its partition, in calls of at most
        BATCH_BYTES (a larger entry alone): one message matching many sessions is one entry
        per queue, each carrying the whole message. Entries an instance refused as not its
        own (FENCED), or that met a dead owner, are sent again once the new owner announced
        itself (at most OWNER_WAIT_S; then FENCED): append_client.py. Appends are idempotent
        per message id, so a call that fails after an earlier one succeeded is retried whole
        by the caller without storing anything twice.

        `routes_checked` (a connection node's copy of the route table chose the entries):
        that copy's version, StaleRoutesError when it is not current. `routes_current` (the
        router): its table's version, which the queue learns. Even no entries make a call
        when checked: the answer tells the node its copy is current."""
        return await self._appends.append(tenant, entries, routes_checked, routes_current)

    async def fence_routes(self, tenant: str, version: int) -> int:
        """Every queue instance holds `version` (or a higher one) of the tenant's route
        table before this returns; the highest version any of them holds. Every instance:
        the owner of each partition in the ownership map, or (no map yet) every index
        below the instance count they report."""
        bus = self._calls.bus
        if bus is None:
            raise UnavailableError("fencing route versions needs the NATS bus")
        await self._calls.follow()
        req = pb.FenceRoutesRequest(tenant=tenant, version=version).SerializeToString()
        owners = self._calls.owners

        def all_in(replies: list[bytes]) -> bool:
            answers = [pb.FenceRoutesResponse.FromString(r) for r in replies]
            if owners.complete():
                return {a.instance_id for a in answers} >= owners.owner_ids()
            count = max(a.instance_count for a in answers)
            return {a.instance_ordinal for a in answers} >= set(range(count))

        replies = await bus.call_all(FENCE_ROUTES_SUBJECT, req, all_in)
        return max(pb.FenceRoutesResponse.FromString(r).version for r in replies)

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        reader: str = "",
    ) -> QueueRead:
        """Up to `limit` unexpired entries from `from_seq` on. With `mark_delivered` (the
        caller sends them to a connection) the queue records them as delivered, durably,
        before answering; `reader` names the caller, which lets the queue push it new
        entries in its notices while it is caught up."""
        req = pb.ReadRequest(
            tenant=tenant,
            queue_id=queue_id,
            from_seq=from_seq,
            limit=limit,
            mark_delivered=mark_delivered,
            reader=reader,
        )
        resp = await self._call(tenant, queue_id, READ_SUBJECT, _read, req, pb.ReadResponse)
        return QueueRead(
            tuple(_entry_from_pb(e) for e in resp.entries),
            resp.acked_through,
            resp.last_seq,
            resp.delivered_through,
        )

    async def ack(
        self,
        tenant: str,
        queue_id: str,
        through_seq: int,
        detach_reader: str = "",
        renew: tuple[str, int, int] | None = None,
        seqs: Sequence[int] = (),
    ) -> None:
        """Acknowledge through `through_seq` (0: nothing); `detach_reader`: that reader stops
        reading, the queue pushes nothing more to it; `renew` (reader, room, seen_through):
        that reader, with no Read under way, can take `room` entries beyond `seen_through`
        (its push credit, services/queue/readers.py). A durable shared group's member
        acknowledges `seqs` one by one, naming itself in `renew` (services/queue/groups.py)."""
        req = pb.AckRequest(
            tenant=tenant,
            queue_id=queue_id,
            through_seq=through_seq,
            detach_reader=detach_reader,
            seqs=seqs,
        )
        if renew is not None:
            req.reader, req.room, req.seen_through = renew
        await self._call(tenant, queue_id, ACK_SUBJECT, _ack, req, pb.AckResponse)

    async def mark_released(self, tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        """Record the client's PUBREC for these entries (durable once this returns)."""
        req = pb.MarkReleasedRequest(tenant=tenant, queue_id=queue_id, seqs=seqs)
        await self._call(
            tenant, queue_id, RELEASED_SUBJECT, _released, req, pb.MarkReleasedResponse
        )

    async def drop(self, tenant: str, queue_id: str) -> None:
        await self._rpc.call(self._rpc.stub.Drop, pb.DropRequest(tenant=tenant, queue_id=queue_id))

    async def close(self) -> None:
        await self._calls.close()
        await self._rpc.close()


# Which method of a stub a call uses (the stub is the owner's).
def _read(s: Stub) -> Any:
    return s.stub.Read


def _ack(s: Stub) -> Any:
    return s.stub.Ack


def _released(s: Stub) -> Any:
    return s.stub.MarkReleased


class QueueAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.QueueAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def queue_stats(self, tenant: str, queue_id: str) -> QueueStats:
        req = pb.GetQueueStatsRequest(tenant=tenant, queue_id=queue_id)
        r = await self._rpc.call(self._rpc.stub.GetQueueStats, req)
        return QueueStats(r.depth, r.last_seq, r.acked_through, r.dropped)

    async def close(self) -> None:
        await self._rpc.close()
