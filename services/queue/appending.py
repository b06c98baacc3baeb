"""The append flow: one request's entries, grouped by queue, stored under their partitions'
locks and epochs, each entry judged (`EntryResult`), the readers told (notices.py).

Theory of operation:
- A request's queues are appended together, so the store can commit them at once (one fsync
  per request, not per queue); the partitions' locks (one writer per partition) are taken in
  partition order, so two requests never deadlock.
- A queue whose partition this instance does not (or no longer) own answers FENCED for every
  entry; the store answers FENCED too when another instance claimed it meanwhile.
- The depth cap is the setting's, or the tenant's max_queue_depth when that is lower: then
  an entry past it is refused (QUOTA_EXCEEDED, the publisher learns: 0x97), never dropped.
- The tenant's max_queued_bytes: the room is taken, with no await before the store call,
  from what the tenant holds here, at the other instances and in appends under way, so the
  appends of one request (and concurrent ones) together stay within it.
- Small appends to a queue whose reader is caught up are pushed to it (readers.py): the
  credit is reserved before the store call and settled after it, whatever happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from typing import Any

from services.common.group_routes import is_group_queue
from services.common.limits_copies import LimitsCopies
from services.common.log_summary import LogSummary
from services.common.refusals import Refusals
from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueStore,
)
from services.queue.config import QueueSettings
from services.queue.core import partition_of
from services.queue.depths import QueueDepths
from services.queue.notices import Notices
from services.queue.ownership import Partitions
from services.queue.readers import Lease, Readers

log = logging.getLogger("starling.queue")


class EntryResult(enum.Enum):
    """What an append did with one entry, as its caller sees it."""

    STORED = "stored"  # stored now, or before (appends are idempotent per message id)
    FENCED = "fenced"  # this instance does not own the queue's partition: not stored
    QUEUE_FULL = "queue_full"  # the setting's depth limit refused it: dropped for good
    QUOTA_EXCEEDED = "quota_exceeded"  # the tenant's max_queue_depth or max_queued_bytes


# The store's outcomes judged, the depth cap being the setting's, or the tenant's quota.
_BY_SETTING = {
    AppendOutcome.OK: EntryResult.STORED,
    AppendOutcome.DUPLICATE: EntryResult.STORED,
    AppendOutcome.FULL: EntryResult.QUEUE_FULL,
    AppendOutcome.FENCED: EntryResult.FENCED,
    AppendOutcome.OVER_BYTES: EntryResult.QUOTA_EXCEEDED,
}
_BY_QUOTA = {**_BY_SETTING, AppendOutcome.FULL: EntryResult.QUOTA_EXCEEDED}


@dataclasses.dataclass(frozen=True, slots=True)
class AppendDeps:
    """What the append flow works with (built by the servicer from the composition root's)."""

    store: QueueStore
    parts: Partitions
    readers: Readers
    depths: QueueDepths
    notices: Notices
    refusals: Refusals
    limits: LimitsCopies | None = None  # tenants' limits (quota service); None: settings only


@dataclasses.dataclass(frozen=True, slots=True)
class _Caps:
    """What one append request may do: the depth cap and policy, whether the cap is the
    tenant's quota, and the tenant's max_queued_bytes (0: none)."""

    depth: int
    drop_oldest: bool
    quota: bool
    queued_bytes: int = 0


def _own(qid: str, caps: _Caps) -> _Caps:
    """A durable shared group's queue never drops an entry it took: past the depth cap it
    refuses (the publisher gets 0x97) whatever the depth policy."""
    if caps.quota or not caps.drop_oldest or not is_group_queue(qid):
        return caps
    return dataclasses.replace(caps, drop_oldest=False, quota=True)


@dataclasses.dataclass(frozen=True, slots=True)
class _QueueAppend:
    """One queue's append: the store's report (no drops when the quota refused instead) and
    each entry's result."""

    report: AppendReport
    results: list[EntryResult]


class Appending:
    """Call `append` with a request's entries by queue; everything else is its steps."""

    def __init__(self, *, deps: AppendDeps, settings: QueueSettings) -> None:
        self._d = deps
        self._max_depth = settings.max_queue_depth
        self._drop_oldest = settings.depth_policy == "drop_oldest"
        self._push_max_bytes = settings.notice_max_bytes
        # Other instances' byte figures older than three of their periods are forgotten.
        self._peers_ttl_s = 3 * settings.queued_bytes_share_s
        # Refused appends can come per publish: the log gets a line per tenant per 10 s.
        self._refused_log = LogSummary(log, "queue_quota_refused")

    async def append(
        self, tenant: str, by_queue: dict[str, list[NewQueueItem]]
    ) -> list[list[EntryResult]]:
        """Store each queue's items, in order; their results, per queue in `by_queue`'s
        order. The readers hear of the new entries before this returns."""
        readers = self._d.readers
        pushes = {qid: self._push_to(tenant, qid, items) for qid, items in by_queue.items()}
        try:
            appended = await self._append_all(tenant, by_queue, pushes)
        except BaseException:
            self._settle(by_queue, pushes, None)
            raise
        self._settle(by_queue, pushes, appended)  # before any await below
        for (qid, items), one in zip(by_queue.items(), appended, strict=True):
            lease = pushes[qid]
            # Pushed only if the lease is still the one the append marked for: a reader that
            # took the queue over meanwhile reads the entries (they were sent to no one).
            pushed = lease is not None and lease is readers.get(tenant, qid)
            await self._d.notices.announce(
                tenant, qid, one.report, items if pushed else None, lease
            )
        return [one.results for one in appended]

    def _push_to(self, tenant: str, qid: str, items: list[NewQueueItem]) -> Lease | None:
        """The caught-up reader to push this append's entries to, if they are small enough
        and it has room for them."""
        if not self._push_max_bytes:
            return None
        readers = self._d.readers
        if sum(len(it.data) for it in items) > self._push_max_bytes:
            lease = readers.get(tenant, qid)
            if lease is not None:
                readers.missed(lease)  # it reads these back before any push
            return None
        return readers.push(tenant, qid, len(items))

    def _settle(
        self,
        by_queue: dict[str, list[NewQueueItem]],
        pushes: dict[str, Lease | None],
        appended: list[_QueueAppend] | None,
    ) -> None:
        """The credit `_push_to` reserved for each queue's entries is settled: pushed
        through the append's last seq, or (`appended` None: the append failed) given back,
        the reader sent to read first: some queues' entries may be stored, marked delivered,
        all the same, and were never pushed."""
        readers = self._d.readers
        for i, (qid, lease) in enumerate(pushes.items()):
            if lease is None:
                continue
            if appended is None:
                readers.pushed(lease, len(by_queue[qid]), 0)
                readers.missed(lease)
            else:
                readers.pushed(lease, len(by_queue[qid]), appended[i].report.last_seq)

    async def _caps(self, tenant: str) -> _Caps:
        caps = _Caps(depth=self._max_depth, drop_oldest=self._drop_oldest, quota=False)
        if self._d.limits is None:
            return caps
        limits = (await self._d.limits.fetch(tenant)).limits
        cap = limits.max_queue_depth
        if cap and (not caps.depth or cap < caps.depth):
            # The tenant's quota binds: refused, never dropped, so the publisher learns
            # (0x97) that a subscriber did not get it; no older entry is lost for it.
            caps = _Caps(depth=cap, drop_oldest=False, quota=True)
        if limits.max_queued_bytes:
            caps = dataclasses.replace(caps, queued_bytes=limits.max_queued_bytes)
        return caps

    async def _append_all(
        self,
        tenant: str,
        by_queue: dict[str, list[NewQueueItem]],
        pushes: dict[str, Lease | None],
    ) -> list[_QueueAppend]:
        """Every queue of a request appended at once, under its partitions' locks, taken
        in partition order."""
        parts = self._d.parts
        order = sorted({partition_of(tenant, qid, parts.count) for qid in by_queue})
        caps = await self._caps(tenant)

        def appends() -> list[Coroutine[Any, Any, _QueueAppend]]:
            return [
                self._append_one(tenant, qid, items, pushes[qid] is not None, _own(qid, caps))
                for qid, items in by_queue.items()
            ]

        if len(order) == 1:  # one partition (the usual case): no AsyncExitStack
            async with parts.locks[order[0]]:
                one = appends()
                # One queue: no task (and loop turn) of its own for it.
                return [await one[0]] if len(one) == 1 else list(await asyncio.gather(*one))
        async with AsyncExitStack() as stack:
            for p in order:
                await stack.enter_async_context(parts.locks[p])
            return list(await asyncio.gather(*appends()))

    async def _append_one(
        self, tenant: str, qid: str, items: list[NewQueueItem], push: bool, caps: _Caps
    ) -> _QueueAppend:
        """Append to one queue under its partition's epoch (the caller holds the partition's
        lock). `push`: the new entries go to a reader in the notice, so the same transaction
        marks them delivered."""
        d = self._d
        p = partition_of(tenant, qid, d.parts.count)
        epoch = d.parts.epochs.get(p)
        if epoch is None:
            return _QueueAppend(
                AppendReport([AppendOutcome.FENCED] * len(items)), [EntryResult.FENCED] * len(items)
            )
        room: int | None = None
        size = 0
        if caps.queued_bytes:
            room, size = await self._reserve(tenant, p, items, caps.queued_bytes)
        report = AppendReport([])
        d.depths.begin(p)
        try:
            report = await d.store.append(
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
            d.depths.end(p, tenant, QueueChange(report.depth_change, report.bytes_change))
            if size:
                d.depths.reserve(tenant, -size)
        if AppendOutcome.FENCED in report.outcomes:
            d.parts.fenced(p)  # another instance took the partition over
        return self._judged(tenant, qid, report, caps)

    async def _reserve(
        self, tenant: str, p: int, items: list[NewQueueItem], cap_bytes: int
    ) -> tuple[int, int]:
        """The room the tenant's `cap_bytes` leaves, and this append's size, now reserved
        (the caller gives it back)."""
        depths = self._d.depths
        try:
            await depths.load(self._d.store, p)  # a partition just gained
        except Exception as exc:  # the store is away: the append itself will tell
            log.warning("queue_depth_scan_failed", extra={"error": repr(exc)})
        # Taken with no await before the store call: the appends of one request (and
        # concurrent ones) see each other's reservations, so together they stay within the
        # room.
        room = max(0, cap_bytes - depths.held_bytes(tenant, self._peers_ttl_s))
        size = sum(len(it.data) for it in items)
        depths.reserve(tenant, size)
        return room, size

    def _judged(self, tenant: str, qid: str, report: AppendReport, caps: _Caps) -> _QueueAppend:
        """Each entry's result; the refusals counted and logged."""
        outcomes = report.outcomes
        over = outcomes.count(AppendOutcome.OVER_BYTES)
        if over:
            self._refused("max_queued_bytes", tenant, qid, over)
        if not caps.quota:
            return _QueueAppend(report, [_BY_SETTING[o] for o in outcomes])
        refused = outcomes.count(AppendOutcome.FULL)
        if refused:
            self._refused("max_queue_depth", tenant, qid, refused)
            # Refused, not dropped: the publisher is told (no drop event, no drop count).
            report = dataclasses.replace(report, dropped=0)
        return _QueueAppend(report, [_BY_QUOTA[o] for o in outcomes])

    def _refused(self, limit: str, tenant: str, qid: str, count: int) -> None:
        self._d.refusals.count(limit, tenant, count)
        self._refused_log.add(tenant, count, qid)
