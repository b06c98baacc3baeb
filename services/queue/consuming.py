"""The readers' side of the queues: reads (and, at the owner, which reader each queue pushes
to: readers.py), acks, released marks and a queue's drop, each write's depth change counted
(depths.py); partitions this instance lost are forgotten here. A durable shared group's
queue is read by claims and acknowledged entry by entry (groups.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence, Set
from dataclasses import dataclass
from typing import Any

from services.common import clock
from services.common.group_routes import is_group_queue
from services.common.rpc.errors import UnavailableError
from services.common.rpc.limits import BATCH_BYTES
from services.common.store.ports_queue import QueueChange, QueueStore, StoredEntry
from services.queue.core import partition_of
from services.queue.depths import QueueDepths
from services.queue.groups import Announce, GroupDispatch
from services.queue.ownership import Partitions
from services.queue.readers import Readers

DEFAULT_READ = 100  # entries a Read that names no limit gets
MAX_READ = 10_000  # the most one Read gets (readers.py MAX_CREDIT matches it)


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """What one read found: the unexpired entries, in seq order, and the queue's marks."""

    entries: list[StoredEntry]
    acked_through: int
    # The last seq this read looked at, so the reader continues after entries it was not
    # given (expired ones).
    last_seq: int
    delivered_through: int


@dataclass(frozen=True, slots=True)
class Renewal:
    """A caught-up reader, with no Read under way, can take `room` entries beyond
    `seen_through` (its push credit, readers.py)."""

    reader: str
    room: int
    seen_through: int


class Consuming:
    """The calls of a queue's readers and of the session service (drop), at any instance;
    only the partition's owner keeps readers."""

    def __init__(
        self,
        *,
        store: QueueStore,
        parts: Partitions,
        readers: Readers,
        depths: QueueDepths,
        announce: Announce,
    ) -> None:
        """`announce(tenant, queue_id)`: a durable group's queue has entries to hand out
        again (groups.py)."""
        self._store = store
        self._parts = parts
        self._readers = readers
        self._depths = depths
        self._announce = announce
        self._groups = GroupDispatch(
            store=store, parts=parts, counted=self._counted, announce=announce
        )

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        *,
        mark_delivered: bool = False,
        reader: str = "",
        link: Any = None,
    ) -> ReadBatch:
        """Up to `limit` unexpired entries from `from_seq` on, with `mark_delivered` marked
        delivered (durably). Its `reader` then is a delivery the owner may push to from now
        on, on `link` (the queue link the call came on; None: NATS)."""
        if reader and is_group_queue(queue_id):  # a member's claim (groups.py)
            got = await self._groups.claim(tenant, queue_id, reader, min(limit, MAX_READ))
            last = got.entries[-1].seq if got.entries else 0
            return ReadBatch(got.entries, got.acked_through, last, got.delivered_through)
        limit = min(limit or DEFAULT_READ, MAX_READ)
        reader = reader if mark_delivered else ""
        # Capped by bytes as well as count, so the answer fits the gRPC limit and the
        # queue's memory stays bounded; the first entry always comes (a big one still moves).
        entries, st = await self._store.read(
            tenant,
            queue_id,
            max(1, from_seq),
            limit,
            mark_delivered=mark_delivered,
            max_bytes=BATCH_BYTES,
        )
        now_ms = clock.now_ms()
        # Expired: never delivered; the reader's ack passes over it.
        live = [e for e in entries if not e.expires_at_ms or e.expires_at_ms > now_ms]
        scanned = entries[-1].seq if entries else max(from_seq - 1, 0)
        delivered = st.delivered_through  # as it was before this read
        # Only the owner keeps readers (it pushes to them); another instance serves a read
        # from the store alone (a caller whose ownership map is behind).
        if reader and self._parts.owns(partition_of(tenant, queue_id, self._parts.count)):
            readers = self._readers
            delivered = readers.delivered_before(tenant, queue_id, reader, delivered)
            at_end = scanned >= st.last_seq
            room = limit - len(entries)
            readers.read(tenant, queue_id, reader, scanned, at_end, room=room, mark=delivered)
            self._note_link(tenant, queue_id, reader, link)
        return ReadBatch(live, st.acked_through, scanned, delivered)

    async def ack(
        self,
        tenant: str,
        queue_id: str,
        through_seq: int,
        *,
        detach_reader: str = "",
        renew: Renewal | None = None,
        link: Any = None,
        seqs: Sequence[int] = (),
    ) -> None:
        """Acknowledge through `through_seq` (0: nothing); `detach_reader` stops reading
        (nothing more is pushed to it); else `renew` renews a reader's credit. A durable
        group's member acknowledges `seqs` one by one instead (groups.py)."""
        if is_group_queue(queue_id):
            await self._group_ack(tenant, queue_id, seqs, detach_reader, renew)
            return
        if detach_reader:
            self._readers.detach(tenant, queue_id, detach_reader)
        elif renew is not None:  # before any await: a Read sent after this Ack sets it later
            self._readers.renew(tenant, queue_id, renew.reader, renew.room, renew.seen_through)
            self._note_link(tenant, queue_id, renew.reader, link)
        if through_seq:
            await self._counted(tenant, queue_id, self._store.ack(tenant, queue_id, through_seq))

    async def _group_ack(
        self,
        tenant: str,
        queue_id: str,
        seqs: Sequence[int],
        detach_reader: str,
        renew: Renewal | None,
    ) -> None:
        member = detach_reader or (renew.reader if renew is not None else "")
        if member and seqs and not await self._groups.done(tenant, queue_id, member, list(seqs)):
            # Its sender tries again (the owner's announcement may be on its way).
            raise UnavailableError("not the owner of this group's queue")
        if detach_reader:
            await self._groups.detach(tenant, queue_id, detach_reader)

    async def mark_released(self, tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        # Together: the embedded store commits them in one transaction (group commit).
        await asyncio.gather(*(self._store.mark_released(tenant, queue_id, s) for s in seqs))

    async def drop(self, tenant: str, queue_id: str) -> None:
        self._readers.drop(tenant, queue_id)
        self._groups.forget(tenant, queue_id)
        await self._counted(tenant, queue_id, self._store.drop(tenant, queue_id))
        if is_group_queue(queue_id):  # its clean-session members go back to NATS
            await self._announce(tenant, queue_id, dropped=True)

    async def _counted(self, tenant: str, queue_id: str, write: Awaitable[QueueChange]) -> None:
        """`write` awaited, the depth change it reports counted (depths.py: a scan meanwhile
        keeps the partition's totals)."""
        p = self._depths.partition(tenant, queue_id)
        change = QueueChange()
        self._depths.begin(p)
        try:
            change = await write
        finally:
            self._depths.end(p, tenant, change)

    def _note_link(self, tenant: str, queue_id: str, reader: str, link: Any) -> None:
        """The call being served (a Read or a renewing Ack by `reader`) came on `link`, or
        not: if `reader` holds the queue's lease, its pushes follow that way."""
        lease = self._readers.get(tenant, queue_id)
        if lease is not None and lease.reader == reader:
            lease.link = link


def forget_partitions(
    partitions: Set[int], *, readers: Readers, depths: QueueDepths, count: int
) -> None:
    """This instance no longer owns `partitions`: readers move with their queue's owner
    (the new owner starts afresh), and so do the depths (Partitions' `on_lost`)."""
    readers.drop_partitions(partitions, count)
    depths.lost(partitions)
