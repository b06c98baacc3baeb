"""Cassandra `QueueStore`: per-session queues whose state and entries share one partition.

Tables and statements: cassandra_queue_cql.py; claiming and fencing: cassandra_queue_owner.py;
compaction: cassandra_queue_compaction.py; docs/storage.md has the sizes and consistency
levels, tests/simulation proves the promises on a model of what Cassandra guarantees.

Every change of a queue is ONE conditional batch on its partition, conditioned on the state
it was planned from: `version` AND every column the plan used (a replica read at ONE can show
one transaction's version with an older one's last_seq: the simulation found an append that
planned a taken seq that way), and for an owner's append `fence <= epoch`:
- append: the new state, the entries, their message ids (`IF NOT EXISTS`: a message appended
  already fails the batch, which says so) and the entries the depth policy evicts. Nothing is
  written outside the transaction, so an append answered OK is in the queue, at seqs no other
  writer can take, and an append fenced by a claim wrote nothing. A large append goes in
  several batches (CHUNK_ITEMS, CHUNK_BYTES), each fenced; each item's outcome is that of its
  batch.
- ack: acked_through, depth, acked_bytes and the range delete of the acked entries.
- drop: the static columns and every row (range delete) of the queue.
- mark released: `IF EXISTS` on the entry (a late mark never brings back a deleted entry).
- delivered_through: a compare-and-set of its own that only raises it.
A WriteTimeout of a lightweight transaction (outcome unknown) is settled by reading again at
serial consistency (linearizable) before planning again; so is every failed compare-and-set,
so a stale read at a weak consistency level costs a round, never a wrong decision.

Readers never skip a seq they cannot account for: entries are read at `cassandra_consistency`
(which may be ONE), and when the seqs returned are not contiguous from the first one wanted
the read is done again at serial consistency, which sees every committed batch; a seq missing
then was acked, evicted or compacted away, never an append still in flight.

Held bytes are cumulative offsets: appended_bytes moves with last_seq, each entry carries
end_bytes and size, and an ack sets acked_bytes from the first entry after it (none: all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from services.common.store import cassandra_queue_cql as cql
from services.common.store.cassandra import _future
from services.common.store.cassandra_queue_compaction import (
    cassandra_compact_acked,
    cassandra_compact_expired,
    cassandra_compact_session_queue,
)
from services.common.store.cassandra_queue_cql import MIGRATIONS
from services.common.store.cassandra_queue_owner import QueueOwnership
from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    StoredEntry,
)

__all__ = ["MIGRATIONS", "CassandraQueueStore", "cassandra_compact_acked"]
__all__ += ["cassandra_compact_expired", "cassandra_compact_session_queue"]
_LAST = (1 << 63) - 1


@dataclass
class _Plan:
    """What one batch of an append decided: the new entries with their seqs, each item's
    outcome, the entries it evicts, and the queue's counters after it."""

    writes: list[tuple[int, NewQueueItem]] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)
    evicted_here: list[NewQueueItem] = field(default_factory=list)  # ids kept, never written
    outcomes: list[str] = field(default_factory=list)
    last: int = 0
    depth: int = 0
    dropped: int = 0
    appended: int = 0


def _chunks(items: list[NewQueueItem]) -> Iterator[list[NewQueueItem]]:
    """The items in runs of at most CHUNK_ITEMS and CHUNK_BYTES (at least one item each)."""
    run: list[NewQueueItem] = []
    size = 0
    for item in items:
        if run and (len(run) >= cql.CHUNK_ITEMS or size + len(item.data) > cql.CHUNK_BYTES):
            yield run
            run, size = [], 0
        run.append(item)
        size += len(item.data)
    if run:
        yield run


def _read(row: Any) -> tuple[Any, ...]:
    """The state columns an append was planned from, as its batch's conditions want them."""
    return (row.last_seq, row.depth, row.dropped, row.appended_bytes, row.acked_through)


def _contiguous(entries: list[StoredEntry], start: int) -> bool:
    return all(e.seq == start + i for i, e in enumerate(entries))


class CassandraQueueStore(QueueOwnership):
    component = "queue"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p: Callable[[str], Any] = self._session.prepare
        self._prepare_owner(p)
        self._state_set = p(cql.STATE_SET)
        self._entry_put = p(cql.ENTRY_PUT)
        self._msgid_put = p(cql.MSGID_PUT)
        self._msgids_get = p(cql.MSGIDS_GET)
        self._msgids_serial = p(cql.MSGIDS_GET)
        self._msgids_serial.consistency_level = self._serial_cl
        self._entry_del = p(cql.ENTRY_DEL)
        self._entries_read = p(cql.ENTRIES_READ)
        self._entries_serial = p(cql.ENTRIES_READ)
        self._entries_serial.consistency_level = self._serial_cl
        self._offset = p(cql.OFFSET)
        self._ack_set = p(cql.ACK_SET)
        self._range_del = p(cql.RANGE_DEL)
        self._release = p(cql.RELEASE)
        self._delivered = p(cql.DELIVERED)
        self._drop_state = p(cql.DROP_STATE)
        self._depths = p(cql.DEPTHS)

    async def _cas_batch(self, parts: list[tuple[Any, tuple[Any, ...]]]) -> list[Any] | None:
        """Run one conditional batch; its result rows, None when the outcome is unknown."""
        from cassandra import WriteTimeout, WriteType

        try:
            return list(await _future(self._session.execute_async(self._batch(parts))) or [])
        except WriteTimeout as exc:
            if exc.write_type == WriteType.CAS:
                return None
            raise

    async def state(self, tenant: str, queue_id: str) -> QueueState:
        return cql.state_of(await self.state_row(tenant, queue_id))

    async def append(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        mark_delivered: bool = False,
        room_bytes: int | None = None,
    ) -> AppendReport:
        outcomes: list[str] = []
        last = dropped = depth = added = 0
        for chunk in _chunks(items):
            rep = await self._append_chunk(
                tenant, queue_id, chunk, partition, epoch, max_depth, drop_oldest, room_bytes
            )
            outcomes += rep.outcomes
            if AppendOutcome.FENCED in rep.outcomes:
                outcomes += [AppendOutcome.FENCED] * (len(items) - len(outcomes))
                break
            last, dropped, depth = rep.last_seq, dropped + rep.dropped, depth + rep.depth_change
            added += rep.bytes_change
            if room_bytes is not None:
                ok = [it for it, o in zip(chunk, rep.outcomes, strict=True) if o == "ok"]
                room_bytes -= sum(len(it.data) for it in ok)
        if mark_delivered and AppendOutcome.OK in outcomes:  # pushed: marked before told
            await self._mark_delivered(tenant, queue_id, last)
        return AppendReport(outcomes, last, dropped, depth, added)

    async def _append_chunk(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        room_bytes: int | None,
    ) -> AppendReport:
        """One conditional batch of an append (module docstring), planned again from a serial
        read whenever its compare-and-set fails or its outcome is unknown."""
        fenced = AppendReport([AppendOutcome.FENCED] * len(items))
        row = await self.state_row(tenant, queue_id)
        ids = [it.message_id for it in items]
        known = {r.mid for r in await self._exec(self._msgids_get, (tenant, queue_id, ids))}
        for _ in range(cql.MAX_CAS_TRIES):
            row = await self._owned_state(tenant, queue_id, partition, epoch, row)
            if row is None or max(row.owner_epoch or 0, row.fence or 0) > epoch:
                return fenced
            plan = await self._plan(
                tenant, queue_id, items, row, known, max_depth, drop_oldest, room_bytes
            )
            report = AppendReport(
                plan.outcomes,
                plan.last,
                plan.dropped - row.dropped,
                plan.depth - row.depth,
                plan.appended - (row.appended_bytes or 0),
            )
            if (plan.last, plan.depth, plan.dropped) == (row.last_seq, row.depth, row.dropped):
                return report  # nothing to write: duplicates (stored) or nothing left
            res = await self._cas_batch(self._append_parts(tenant, queue_id, epoch, row, plan))
            if res is not None and cql.applied(res):
                return report
            # Lost the compare-and-set (or cannot tell): the state and the message ids again,
            # linearizably (an id stored meanwhile, perhaps by this very batch, is a duplicate).
            row = await self.state_row(tenant, queue_id, serial=True)
            known = {r.mid for r in await self._exec(self._msgids_serial, (tenant, queue_id, ids))}
        raise RuntimeError(f"append to {queue_id!r} lost {cql.MAX_CAS_TRIES} compare-and-sets")

    def _append_parts(
        self, tenant: str, queue_id: str, epoch: int, row: Any, plan: _Plan
    ) -> list[tuple[Any, tuple[Any, ...]]]:
        """The statements of one append batch: the fenced state change first."""
        version = row.version or 0
        state = (epoch, version + 1, plan.last, plan.depth, plan.dropped, plan.appended)
        parts: list[tuple[Any, tuple[Any, ...]]] = [
            (self._state_set, (*state, tenant, queue_id, version, epoch, epoch, *_read(row)))
        ]
        parts += [(self._entry_del, (tenant, queue_id, seq)) for seq in plan.evict]
        offset = row.appended_bytes or 0
        for seq, item in plan.writes:
            offset += len(item.data)
            entry = (item.message_id, item.qos, item.data, item.expires_at_ms, offset)
            size = len(item.data)
            ttl = cql.BACKSTOP_TTL_S
            parts.append((self._entry_put, (tenant, queue_id, seq, *entry, size, ttl)))
            parts.append(
                (self._msgid_put, (tenant, queue_id, item.message_id, seq, cql.MSGID_TTL_S))
            )
        for item in plan.evicted_here:
            parts.append((self._msgid_put, (tenant, queue_id, item.message_id, 0, cql.MSGID_TTL_S)))
        return parts

    async def _plan(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        row: Any,
        known: set[str],
        max_depth: int,
        drop_oldest: bool,
        room_bytes: int | None,
    ) -> _Plan:
        """Each item's outcome and seq from the state `row`, the oldest entries dropped where
        the depth policy says so; nothing written yet."""
        plan = _Plan(last=row.last_seq, depth=row.depth, dropped=row.dropped)
        acked, seen = row.acked_through, set(known)
        for item in items:
            if item.message_id in seen:
                plan.outcomes.append(AppendOutcome.DUPLICATE)
                continue
            added = sum(len(it.data) for _, it in plan.writes)  # evicted ones not counted
            if room_bytes is not None and added + len(item.data) > room_bytes:
                plan.outcomes.append(AppendOutcome.OVER_BYTES)
                continue
            seen.add(item.message_id)
            if max_depth and plan.depth >= max_depth:
                if not drop_oldest:
                    plan.dropped += 1
                    plan.outcomes.append(AppendOutcome.FULL)
                    continue
                await self._evict_one(tenant, queue_id, acked + 1, row.last_seq, plan)
            plan.last += 1
            plan.depth += 1
            plan.writes.append((plan.last, item))
            plan.outcomes.append(AppendOutcome.OK)
        plan.appended = (row.appended_bytes or 0) + sum(len(it.data) for _, it in plan.writes)
        return plan

    async def _evict_one(
        self, tenant: str, queue_id: str, first: int, last: int, plan: _Plan
    ) -> None:
        """Make room for one entry: the oldest stored one not chosen yet, else the oldest this
        append planned (never written; its message id kept, a retry of it is a duplicate)."""
        rows = await self._exec(
            self._entries_read, (tenant, queue_id, first, last, len(plan.evict) + 1)
        )
        left = [r.seq for r in rows if r.seq not in plan.evict]
        if left:
            plan.evict.append(left[0])
        elif plan.writes:
            plan.evicted_here.append(plan.writes.pop(0)[1])
        else:
            return
        plan.depth -= 1
        plan.dropped += 1

    async def _slice(
        self, stmt: Any, tenant: str, queue_id: str, start: int, last: int, limit: int, cap: int
    ) -> list[StoredEntry]:
        out: list[StoredEntry] = []
        total = 0
        async for page in self._pages(stmt, (tenant, queue_id, start, last, limit)):
            for r in page:
                total += len(r.data)
                if out and cap and total > cap:
                    return out
                out.append(StoredEntry(r.seq, r.qos, r.data, r.expires_at_ms, bool(r.released)))
        return out

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        st = cql.state_of(await self.state_row(tenant, queue_id))
        start = max(from_seq, st.acked_through + 1)
        args = (tenant, queue_id, start, st.last_seq, limit, max_bytes)
        entries = await self._slice(self._entries_read, *args)
        if not _contiguous(entries, start):  # never skip a seq not accounted for
            entries = await self._slice(self._entries_serial, *args)
        if mark_delivered and entries and entries[-1].seq > st.delivered_through:
            await self._mark_delivered(tenant, queue_id, entries[-1].seq)
        return entries, st

    async def _mark_delivered(self, tenant: str, queue_id: str, through: int) -> None:
        """Raise delivered_through to `through` unless it is there already (committed before
        this returns); nothing for a queue that is gone."""
        row = await self.state_row(tenant, queue_id)
        while row is not None and (row.delivered_through or 0) < through:
            res = await self._cas(
                self._delivered, (through, tenant, queue_id, row.delivered_through, through)
            )
            if res is not None and cql.applied(res):
                return
            row = await self.state_row(tenant, queue_id, serial=True)
            if row is not None and row.last_seq < through:
                return  # dropped and begun again: nothing of this to mark

    async def _acked_offset(self, tenant: str, queue_id: str, through: int, row: Any) -> int:
        """acked_bytes after an ack through `through`, within [acked_bytes, appended_bytes]."""
        appended, acked = row.appended_bytes or 0, row.acked_bytes or 0
        nxt = await self._row(self._offset, (tenant, queue_id, through))
        offset = appended if nxt is None else (nxt.end_bytes or 0) - (nxt.size or 0)
        return min(max(offset, acked), appended)

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        row = await self.state_row(tenant, queue_id)
        for _ in range(cql.MAX_CAS_TRIES):
            if row is None:
                return QueueChange()
            through = min(through_seq, row.last_seq)
            if through <= row.acked_through:
                return QueueChange()
            depth = max(0, row.depth - (through - row.acked_through))
            acked_bytes = await self._acked_offset(tenant, queue_id, through, row)
            version = row.version or 0
            new = (through, depth, version + 1, acked_bytes, tenant, queue_id, version)
            was = (row.last_seq, row.acked_through, row.depth, row.acked_bytes, row.appended_bytes)
            parts = [
                (self._ack_set, (*new, *was)),
                (self._range_del, (tenant, queue_id, 1, through)),
            ]
            res = await self._cas_batch(parts)
            if res is not None and cql.applied(res):
                return QueueChange(depth - row.depth, -(acked_bytes - (row.acked_bytes or 0)))
            row = await self.state_row(tenant, queue_id, serial=True)
        raise RuntimeError(f"ack of {queue_id!r} lost {cql.MAX_CAS_TRIES} compare-and-sets")

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        await self._cas(self._release, (cql.BACKSTOP_TTL_S, tenant, queue_id, seq))

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        row = await self.state_row(tenant, queue_id)
        for _ in range(cql.MAX_CAS_TRIES):
            if row is None:
                return QueueChange()
            parts = [
                (self._drop_state, (tenant, queue_id, row.version)),
                (self._range_del, (tenant, queue_id, 0, _LAST)),
            ]
            res = await self._cas_batch(parts)
            if res is not None and cql.applied(res):
                return QueueChange(-int(row.depth), -cql.held(row))
            row = await self.state_row(tenant, queue_id, serial=True)
        raise RuntimeError(f"drop of {queue_id!r} lost {cql.MAX_CAS_TRIES} compare-and-sets")

    async def depths(self) -> list[tuple[str, str, int, int]]:
        # The static columns of every queue (SELECT DISTINCT reads one row per partition),
        # paged by the driver: at start and now and then, never per message.
        out: list[tuple[str, str, int, int]] = []
        async for page in self._pages(self._depths, ()):
            out += [
                (r.tenant, r.queue_id, int(r.depth), cql.held(r))
                for r in page
                if r.depth is not None and (r.depth or cql.held(r))
            ]
        return out
