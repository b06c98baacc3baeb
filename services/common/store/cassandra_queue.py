"""Cassandra `QueueStore` with the row keys of DESIGN.md.

queue_entries ((tenant, queue_id, bucket), seq) with bucket = seq >> 16, so partitions stay
bounded and Murmur3 spreads queues; queue_state ((tenant, queue_id)) holds last seq, acked
through, depth and the owner epoch; queue_msgids ((tenant, queue_id), message_id) makes
appends idempotent. Each queue has a single writer (the owner of its partition); its state
update is a lightweight transaction conditioned on the owner epoch, so a fenced instance
cannot advance a queue. Every change of the counters (last seq, acked through, depth,
dropped) is a compare-and-set on queue_state.version, the value read: two appends racing
(an old and a new owner during a hand-over) can never both take one seq, and an ack racing an
append can neither lose the other's depth change nor move acked-through backwards; the loser
reads again and re-plans. Entries are written, and acked ones deleted, only after the
compare-and-set won. Acked ranges go with range deletes; entries carry a TTL backstop.
queue_state.delivered_through (the highest seq handed to a connection) only grows: readers
raise it with a compare-and-set, so two readers of one queue during a takeover never lower it.
A row from before that column has it null, read as "everything queued may have been sent".

Held bytes (the tenant's max_queued_bytes) are cumulative offsets, so an ack needs no read of
the entries it passes: queue_state.appended_bytes is the data bytes ever appended (moved by
the append's compare-and-set with last_seq), each entry carries end_bytes (appended_bytes
through it) and size, and queue_state.acked_bytes is the offset the last ack reached: the
first stored entry after the ack's seq gives it (its end_bytes - size), none gives
appended_bytes. The queue holds appended_bytes - acked_bytes. Entries removed without an ack
(the compaction of expired ones, a crash's gap) count until an ack passes them; so do
entries the depth policy drops (drop_oldest), at most max_depth of them. An ack racing an
append whose entries are not written yet (seconds at most) may take those for gone: they
leave the count early (one append's worth, until they are acked). Rows from before these
columns count as 0 bytes.

Fencing is strict (issue 13): once `claim_partition` returned a new epoch, no append of an
older epoch changes any queue of the partition. The counters' compare-and-set is conditioned
on queue_state.owner_epoch, but the partition's epoch is in another row, and Cassandra's
conditions cover one partition; so a claim *takes* each queue of the partition: it raises
that queue's owner_epoch with a compare-and-set before it returns. partition_queues
((partition), tenant, queue_id) lists the queues to take: an owner registers a queue there
before its first write to it under its epoch, then reads the partition's epoch at serial
consistency (linearizable) and writes only if it is still its own. Either the registration
came before the claim listed the partition (the claim takes the queue, and the stale append's
compare-and-set fails on owner_epoch), or the serial read comes after the claim's epoch
(FENCED). Cost: a claim makes one lightweight transaction per queue of the partition (32 at a
time); an owner's first append to a queue, one registration and one serial read. Rows of
dropped queues stay registered (a claim's transaction on them changes nothing). An append
whose compare-and-set won before the take still writes its entries after it (seconds at
most): the new owner may meet those seqs not yet written, as after a crash in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.ports import (
    BUCKET_BITS,
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    StoredEntry,
    entry_row,
)

BACKSTOP_TTL_S = 30 * 24 * 3600
MAX_CAS_TRIES = 64  # compare-and-set rounds of one append or ack against concurrent writers
TAKE_AT_ONCE = 32  # queues a claim takes concurrently

MIGRATIONS = [
    Migration(
        1,
        "queue entries, state, message ids, partition owners",
        (
            """CREATE TABLE IF NOT EXISTS queue_entries (
             tenant text, queue_id text, bucket bigint, seq bigint, message_id text, qos int,
             data blob, expires_at_ms bigint, released boolean,
             PRIMARY KEY ((tenant, queue_id, bucket), seq))
           WITH CLUSTERING ORDER BY (seq ASC)""",
            """CREATE TABLE IF NOT EXISTS queue_state (
             tenant text, queue_id text, last_seq bigint, acked_through bigint, depth bigint,
             dropped bigint, owner_epoch bigint, delivered_through bigint,
             PRIMARY KEY ((tenant, queue_id)))""",
            """CREATE TABLE IF NOT EXISTS queue_msgids (
             tenant text, queue_id text, message_id text, seq bigint,
             PRIMARY KEY ((tenant, queue_id), message_id))
           WITH default_time_to_live = 2592000""",
            "CREATE TABLE IF NOT EXISTS partition_owner (partition int PRIMARY KEY, epoch bigint)",
        ),
    ),
    Migration(
        2,
        "queue_state.delivered_through",
        (AddColumn("queue_state", "delivered_through", "bigint"),),
    ),
    # Every change of the counters is a compare-and-set on this (null on rows from before).
    Migration(3, "queue_state.version", (AddColumn("queue_state", "version", "bigint"),)),
    # The queues a claim takes (module docstring: strict fencing).
    Migration(
        4,
        "partition_queues",
        (
            """CREATE TABLE IF NOT EXISTS partition_queues (
             partition int, tenant text, queue_id text,
             PRIMARY KEY ((partition), tenant, queue_id))""",
        ),
    ),
    # Held bytes as cumulative offsets (module docstring).
    Migration(
        5,
        "queue bytes offsets",
        (
            AddColumn("queue_state", "appended_bytes", "bigint"),
            AddColumn("queue_state", "acked_bytes", "bigint"),
            AddColumn("queue_entries", "end_bytes", "bigint"),
            AddColumn("queue_entries", "size", "bigint"),
        ),
    ),
]


def _held(row: Any) -> int:
    """The bytes a queue_state row holds (null offsets, from before the columns: 0)."""
    return max(0, (row.appended_bytes or 0) - (row.acked_bytes or 0))


def _state_of(row: Any) -> QueueState:
    """A queue_state row as a `QueueState` (no row: an empty queue). A null delivered_through
    (a row from before the column) counts as last_seq: whatever was queued may have been
    sent, so it is resent with DUP=1."""
    if row is None:
        return QueueState(0, 0, 0, 0)
    delivered = row.last_seq if row.delivered_through is None else row.delivered_through
    return QueueState(
        row.last_seq, row.acked_through, row.depth, row.dropped, delivered, _held(row)
    )


@dataclass
class _AppendPlan:
    """What an append decided before writing: the new entries with their seqs, each item's
    outcome, the oldest entries it evicts, and the queue's counters after it."""

    writes: list[tuple[int, NewQueueItem]]
    evict: list[int]  # stored entries to delete
    evicted_here: list[NewQueueItem]  # planned then evicted by this append: ids only
    outcomes: list[str]
    last: int
    depth: int
    dropped: int
    dropped_before: int
    appended_bytes: int  # queue_state.appended_bytes after it


class CassandraQueueStore(CassandraBase):
    component = "queue"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._prepare_owner_and_state(p)
        self._prepare_msgids(p)
        self._prepare_entries(p)
        self._prepare_drop(p)

    def _prepare_owner_and_state(self, p: Callable[[str], Any]) -> None:
        """Statements of partition_owner and queue_state (the fencing epochs and counters)."""
        self._owner_get = p("SELECT epoch FROM partition_owner WHERE partition=?")
        self._owner_serial = p("SELECT epoch FROM partition_owner WHERE partition=?")
        self._owner_serial.consistency_level = self._serial_cl
        self._registered_put = p(
            "INSERT INTO partition_queues (partition, tenant, queue_id) VALUES (?,?,?)"
        )
        self._registered = p("SELECT tenant, queue_id FROM partition_queues WHERE partition=?")
        self._state_take = p(
            "UPDATE queue_state SET owner_epoch=? WHERE tenant=? AND queue_id=? IF owner_epoch<?"
        )
        self._owner_set = p("UPDATE partition_owner SET epoch=? WHERE partition=? IF epoch=?")
        self._owner_new = p(
            "INSERT INTO partition_owner (partition, epoch) VALUES (?, 1) IF NOT EXISTS"
        )
        self._state_get = p(
            "SELECT last_seq, acked_through, depth, dropped, owner_epoch, delivered_through, "
            "version, appended_bytes, acked_bytes FROM queue_state WHERE tenant=? AND queue_id=?"
        )
        self._state_new = p(
            "INSERT INTO queue_state (tenant, queue_id, last_seq, acked_through, "
            "depth, dropped, owner_epoch, delivered_through, version) "
            "VALUES (?,?,?,?,?,?,?,0,0) IF NOT EXISTS"
        )
        self._state_set = p(
            "UPDATE queue_state SET last_seq=?, depth=?, dropped=?, owner_epoch=?, version=?, "
            "appended_bytes=? "
            "WHERE tenant=? AND queue_id=? IF version=? AND owner_epoch<=?"
        )
        self._state_ack = p(
            "UPDATE queue_state SET acked_through=?, depth=?, version=?, acked_bytes=? "
            "WHERE tenant=? AND queue_id=? IF version=?"
        )
        # Compare-and-set on the value read; `last_seq>=?` fails on a row that is gone
        # (a dropped queue), so a late mark never creates one.
        self._state_delivered = p(
            "UPDATE queue_state SET delivered_through=? WHERE tenant=? AND queue_id=? "
            "IF delivered_through=? AND last_seq>=?"
        )

    def _prepare_msgids(self, p: Callable[[str], Any]) -> None:
        """Statements of queue_msgids (idempotent appends)."""
        self._msgid_get = p(
            "SELECT seq FROM queue_msgids WHERE tenant=? AND queue_id=? AND message_id=?"
        )
        self._msgid_put = p(
            "INSERT INTO queue_msgids (tenant, queue_id, message_id, seq) VALUES (?,?,?,?)"
        )

    def _prepare_entries(self, p: Callable[[str], Any]) -> None:
        """Statements of queue_entries."""
        self._entry_put = p(
            "INSERT INTO queue_entries (tenant, queue_id, bucket, seq, "
            "message_id, qos, data, expires_at_ms, released, end_bytes, size) "
            "VALUES (?,?,?,?,?,?,?,?,false,?,?) USING TTL ?"
        )
        self._entry_read = p(
            "SELECT seq, qos, data, expires_at_ms, released FROM queue_entries "
            "WHERE tenant=? AND queue_id=? AND bucket=? AND seq>=? LIMIT ?"
        )
        # The first entry after an acked seq: where the acked bytes' offset now is.
        self._entry_offset = p(
            "SELECT end_bytes, size FROM queue_entries "
            "WHERE tenant=? AND queue_id=? AND bucket=? AND seq>? LIMIT 1"
        )
        self._entry_del_one = p(
            "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND bucket=? AND seq=?"
        )
        self._entry_del_range = p(
            "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND bucket=? AND seq<=?"
        )
        self._entry_release = p(
            "UPDATE queue_entries SET released=true WHERE tenant=? AND "
            "queue_id=? AND bucket=? AND seq=?"
        )

    def _prepare_drop(self, p: Callable[[str], Any]) -> None:
        """Statements that drop a whole queue."""
        # Conditional like every other change of the row (LWT and plain writes do not mix).
        self._drop_state = p("DELETE FROM queue_state WHERE tenant=? AND queue_id=? IF EXISTS")
        self._state_depths = p(
            "SELECT tenant, queue_id, depth, appended_bytes, acked_bytes FROM queue_state"
        )
        self._drop_bucket = p(
            "DELETE FROM queue_entries WHERE tenant=? AND queue_id=? AND bucket=?"
        )

    async def _row(self, stmt: Any, args: tuple[Any, ...]) -> Any:
        rows = list(await self._exec(stmt, args))
        return rows[0] if rows else None

    async def claim_partition(self, partition: int) -> int:
        while True:
            row = await self._row(self._owner_get, (partition,))
            if row is None:
                if (await self._row(self._owner_new, (partition,)))[0]:
                    return 1
                continue
            applied = await self._row(self._owner_set, (row.epoch + 1, partition, row.epoch))
            if applied[0]:
                await self._take(partition, int(row.epoch + 1))
                return int(row.epoch + 1)

    async def _take(self, partition: int, epoch: int) -> None:
        """Raise every registered queue of the partition to `epoch` (module docstring)."""
        queues = [(r.tenant, r.queue_id) for r in await self._exec(self._registered, (partition,))]
        for i in range(0, len(queues), TAKE_AT_ONCE):
            await asyncio.gather(
                *(
                    self._exec(self._state_take, (epoch, tenant, queue_id, epoch))
                    for tenant, queue_id in queues[i : i + TAKE_AT_ONCE]
                )
            )

    async def _still_owner(self, tenant: str, queue_id: str, partition: int, epoch: int) -> bool:
        """Before an epoch's first write to a queue: registered for the claims to take, then
        the partition's epoch read linearizably (module docstring)."""
        await self._exec(self._registered_put, (partition, tenant, queue_id))
        owner = await self._row(self._owner_serial, (partition,))
        return owner is not None and owner.epoch == epoch

    async def state(self, tenant: str, queue_id: str) -> QueueState:
        return _state_of(await self._row(self._state_get, (tenant, queue_id)))

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
        owner = await self._row(self._owner_get, (partition,))
        if owner is None or owner.epoch != epoch:
            return AppendReport([AppendOutcome.FENCED] * len(items))
        for _ in range(MAX_CAS_TRIES):
            row = await self._state_row(tenant, queue_id, partition, epoch)
            if row is None:
                return AppendReport([AppendOutcome.FENCED] * len(items))
            plan = await self._plan_append(
                tenant, queue_id, items, row, max_depth, drop_oldest, room_bytes
            )
            # Reserve the seqs first (conditional on the counters read and on still owning the
            # queue), then write entries: a crash in between leaves a gap that readers skip,
            # never a reused seq.
            res = await self._row(
                self._state_set,
                (
                    plan.last,
                    plan.depth,
                    plan.dropped,
                    epoch,
                    (row.version or 0) + 1,
                    plan.appended_bytes,
                    tenant,
                    queue_id,
                    row.version,
                    epoch,
                ),
            )
            if res[0]:
                for seq in plan.evict:
                    await self._exec(
                        self._entry_del_one, (tenant, queue_id, seq >> BUCKET_BITS, seq)
                    )
                await self._write_entries(tenant, queue_id, plan.writes, row.appended_bytes or 0)
                for item in plan.evicted_here:
                    await self._exec(self._msgid_put, (tenant, queue_id, item.message_id, 0))
                if mark_delivered and plan.writes:  # pushed to a reader: marked before told
                    seen = row.delivered_through
                    if seen is None or plan.last > seen:
                        await self._mark_delivered(tenant, queue_id, seen, plan.last)
                return AppendReport(
                    plan.outcomes,
                    plan.last,
                    plan.dropped - plan.dropped_before,
                    plan.depth - row.depth,
                    plan.appended_bytes - (row.appended_bytes or 0),
                )
            if (getattr(res, "owner_epoch", None) or 0) > epoch:
                return AppendReport([AppendOutcome.FENCED] * len(items))
            # Another writer changed the counters since we read them: read and plan again.
        raise RuntimeError(f"append to {queue_id!r} lost {MAX_CAS_TRIES} compare-and-sets")

    async def _state_row(self, tenant: str, queue_id: str, partition: int, epoch: int) -> Any:
        """The queue's queue_state row, created (zeroed, owned by `epoch`) if it has none;
        None when `epoch` no longer owns the partition (checked before the epoch's first
        write to the queue)."""
        row = await self._row(self._state_get, (tenant, queue_id))
        if row is not None and (row.owner_epoch or 0) >= epoch:
            return row  # the epoch wrote here already (or a newer one did: the CAS fails)
        if not await self._still_owner(tenant, queue_id, partition, epoch):
            return None
        if row is None:
            await self._exec(self._state_new, (tenant, queue_id, 0, 0, 0, 0, epoch))
            row = await self._row(self._state_get, (tenant, queue_id))
        return row

    async def _plan_append(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        row: Any,
        max_depth: int,
        drop_oldest: bool,
        room_bytes: int | None,
    ) -> _AppendPlan:
        """Decide each item's outcome and seq from the state `row`, dropping the oldest
        entries where the depth policy says so; the new entries are not written yet."""
        last, depth, dropped, acked = row.last_seq, row.depth, row.dropped, row.acked_through
        dropped_before = dropped
        plan: list[tuple[int, NewQueueItem]] = []
        evict: list[int] = []
        evicted_here: list[NewQueueItem] = []
        out: list[str] = []
        for item in items:
            if await self._row(self._msgid_get, (tenant, queue_id, item.message_id)):
                out.append(AppendOutcome.DUPLICATE)
                continue
            added = sum(len(it.data) for _, it in plan)
            if room_bytes is not None and added + len(item.data) > room_bytes:
                out.append(AppendOutcome.OVER_BYTES)
                continue
            if max_depth and depth >= max_depth:
                if not drop_oldest:
                    dropped += 1
                    out.append(AppendOutcome.FULL)
                    continue
                oldest = await self._oldest(tenant, queue_id, acked + 1, row.last_seq, evict)
                if oldest is not None:
                    evict.append(oldest)
                    acked = max(acked, oldest)
                    depth -= 1
                    dropped += 1
                elif plan:
                    # The oldest is one this append planned: it is never written, but its
                    # message id is kept (a retry of it is a duplicate, as on SQLite).
                    evicted_here.append(plan.pop(0)[1])
                    depth -= 1
                    dropped += 1
            last += 1
            depth += 1
            plan.append((last, item))
            out.append(AppendOutcome.OK)
        appended = (row.appended_bytes or 0) + sum(len(it.data) for _, it in plan)
        return _AppendPlan(
            plan, evict, evicted_here, out, last, depth, dropped, dropped_before, appended
        )

    async def _write_entries(
        self, tenant: str, queue_id: str, plan: list[tuple[int, NewQueueItem]], offset: int
    ) -> None:
        """Write the planned entries at their reserved seqs, each with its end offset (from
        `offset`, appended_bytes before them), and their message ids."""
        for seq, item in plan:
            offset += len(item.data)
            await self._exec(
                self._entry_put,
                (*entry_row(tenant, queue_id, seq, item), offset, len(item.data), BACKSTOP_TTL_S),
            )
            await self._exec(self._msgid_put, (tenant, queue_id, item.message_id, seq))

    async def _oldest(
        self, tenant: str, queue_id: str, first: int, last: int, evicted: list[int]
    ) -> int | None:
        """The oldest stored entry from `first` not already chosen for eviction."""
        entries = await self._scan(tenant, queue_id, first, last, len(evicted) + 1, 0)
        left = [e.seq for e in entries if e.seq not in evicted]
        return left[0] if left else None

    async def _scan(
        self, tenant: str, queue_id: str, from_seq: int, last: int, limit: int, max_bytes: int
    ) -> list[StoredEntry]:
        out: list[StoredEntry] = []
        total = 0
        for bucket in range(from_seq >> BUCKET_BITS, (last >> BUCKET_BITS) + 1):
            rows = await self._exec(
                self._entry_read, (tenant, queue_id, bucket, from_seq, limit - len(out))
            )
            for r in rows:
                total += len(r.data)
                if out and max_bytes and total > max_bytes:
                    return out
                out.append(StoredEntry(r.seq, r.qos, r.data, r.expires_at_ms, r.released))
            if len(out) >= limit:
                break
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
        row = await self._row(self._state_get, (tenant, queue_id))
        st = _state_of(row)
        start = max(from_seq, st.acked_through + 1)
        entries = await self._scan(tenant, queue_id, start, st.last_seq, limit, max_bytes)
        if mark_delivered and entries:
            # A null (pre-column) value is replaced by a real one on the first mark.
            through = max(entries[-1].seq, st.delivered_through)
            if row.delivered_through is None or through > row.delivered_through:
                await self._mark_delivered(tenant, queue_id, row.delivered_through, through)
        return entries, st

    async def _mark_delivered(
        self, tenant: str, queue_id: str, seen: int | None, through: int
    ) -> None:
        """Raise delivered_through from `seen` (as read; None: never set) to `through`,
        unless another reader raised it at least that far meanwhile. The lightweight
        transaction is committed at serial consistency before this returns."""
        while True:
            res = await self._row(self._state_delivered, (through, tenant, queue_id, seen, through))
            if res is None or res[0]:
                return
            if getattr(res, "last_seq", None) is None:
                return  # the queue was dropped meanwhile: nothing to mark
            current = res.delivered_through
            if current == seen:
                return  # only last_seq>= failed: the queue was dropped and began again
            if current is not None and current >= through:
                return
            seen = current

    async def _acked_offset(self, tenant: str, queue_id: str, through: int, row: Any) -> int:
        """acked_bytes after an ack through `through` (module docstring), never below the
        row's acked_bytes nor above its appended_bytes."""
        appended, acked = row.appended_bytes or 0, row.acked_bytes or 0
        offset = appended
        for bucket in range(through >> BUCKET_BITS, (row.last_seq >> BUCKET_BITS) + 1):
            nxt = await self._row(self._entry_offset, (tenant, queue_id, bucket, through))
            if nxt is not None:
                # An entry from before the offsets (null): the ack frees no bytes.
                offset = acked if nxt.end_bytes is None else nxt.end_bytes - (nxt.size or 0)
                break
        return min(max(offset, acked), appended)

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        for _ in range(MAX_CAS_TRIES):
            row = await self._row(self._state_get, (tenant, queue_id))
            if row is None:
                return QueueChange()
            through = min(through_seq, row.last_seq)
            if through <= row.acked_through:
                return QueueChange()
            depth = max(0, row.depth - (through - row.acked_through))
            acked_bytes = await self._acked_offset(tenant, queue_id, through, row)
            res = await self._row(
                self._state_ack,
                (
                    through,
                    depth,
                    (row.version or 0) + 1,
                    acked_bytes,
                    tenant,
                    queue_id,
                    row.version,
                ),
            )
            if not res[0]:
                continue  # an append or another ack moved the counters: read again
            first = row.acked_through + 1
            for bucket in range(first >> BUCKET_BITS, (through >> BUCKET_BITS) + 1):
                await self._exec(self._entry_del_range, (tenant, queue_id, bucket, through))
            # The change the compare-and-set made.
            return QueueChange(int(depth - row.depth), -(acked_bytes - (row.acked_bytes or 0)))
        raise RuntimeError(f"ack of {queue_id!r} lost {MAX_CAS_TRIES} compare-and-sets")

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        await self._exec(self._entry_release, (tenant, queue_id, seq >> BUCKET_BITS, seq))

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        st = await self.state(tenant, queue_id)
        for bucket in range(0, (st.last_seq >> BUCKET_BITS) + 1):
            await self._exec(self._drop_bucket, (tenant, queue_id, bucket))
        gone = await self._row(self._drop_state, (tenant, queue_id))
        # The row as the conditional delete found it (an append may have moved it since the
        # read above); nothing when another drop came first.
        if gone is None or not gone[0]:
            return QueueChange()
        depth = getattr(gone, "depth", None)
        held = _held(gone) if hasattr(gone, "appended_bytes") else st.bytes
        return QueueChange(-int(st.depth if depth is None else depth), -held)

    async def depths(self) -> list[tuple[str, str, int, int]]:
        # A scan of the whole table (paged by the driver): run at start and now and then,
        # never per message. Filtered here: `depth>0` in CQL would need ALLOW FILTERING.
        out: list[tuple[str, str, int, int]] = []
        async for page in self._pages(self._state_depths, ()):
            out += [
                (r.tenant, r.queue_id, int(r.depth), _held(r)) for r in page if r.depth or _held(r)
            ]
        return out


# ---- Compaction (analytics/jobs/queue_compaction.py) ---------------------------------------
# Synchronous driver calls, made from Spark executors with their own `cassandra.cluster`
# session. The job proposes keys from a token-range scan; each function re-reads what its
# condition depends on right before deleting. As on SQLite every condition only goes from
# false to true, so a row that passed can never be needed again. Depth is left alone: here an
# ack lowers it by seq arithmetic (through - acked_through), which already counts every entry
# up to the ack, removed by compaction or not.


def cassandra_compact_acked(
    session: Any, keyspace: str, tenant: str, queue_id: str, lo_seq: int, through_seq: int
) -> int:
    """Range-delete the queue's entries in [lo_seq, min(through_seq, acked_through read
    now)] (left behind when an ack's deletes did not all land). Returns the bound used, or
    -1 when nothing is acknowledged in range."""
    rows = list(
        session.execute(
            f"SELECT acked_through FROM {keyspace}.queue_state WHERE tenant=%s AND queue_id=%s",
            (tenant, queue_id),
        )
    )
    if not rows:
        return -1
    through = min(through_seq, rows[0][0])  # rows in SELECT order (any row factory)
    if through < lo_seq:
        return -1
    for bucket in range(lo_seq >> BUCKET_BITS, (through >> BUCKET_BITS) + 1):
        session.execute(
            f"DELETE FROM {keyspace}.queue_entries WHERE tenant=%s AND queue_id=%s AND "
            "bucket=%s AND seq<=%s",
            (tenant, queue_id, bucket, through),
        )
    return int(through)


def cassandra_compact_expired(
    session: Any, keyspace: str, tenant: str, queue_id: str, seqs: list[int]
) -> int:
    """Delete expired entries by key. An entry is never rewritten and its expiry is fixed at
    append, so one seen expired stays expired: the scan's observation is the re-check."""
    for seq in seqs:
        session.execute(
            f"DELETE FROM {keyspace}.queue_entries WHERE tenant=%s AND queue_id=%s AND "
            "bucket=%s AND seq=%s",
            (tenant, queue_id, seq >> BUCKET_BITS, seq),
        )
    return len(seqs)


def cassandra_compact_session_queue(
    session: Any, keyspace: str, tenant: str, client_id: str, incarnation: int, now_ms: int
) -> bool:
    """Drop the queue of a session incarnation that is over (its record, read now, expired
    or belongs to a later incarnation); False when the re-check kept it."""
    rows = list(
        session.execute(
            f"SELECT incarnation, expires_at_ms FROM {keyspace}.sessions "
            "WHERE tenant=%s AND client_id=%s",
            (tenant, client_id),
        )
    )
    if not rows:
        return False
    inc, expires = rows[0][0], rows[0][1]
    if not (inc > incarnation or (expires is not None and expires <= now_ms)):
        return False
    qid = f"{client_id}#{incarnation}"
    state = list(
        session.execute(
            f"SELECT last_seq FROM {keyspace}.queue_state WHERE tenant=%s AND queue_id=%s",
            (tenant, qid),
        )
    )
    last = state[0][0] if state else 0
    for bucket in range(0, (last >> BUCKET_BITS) + 1):
        session.execute(
            f"DELETE FROM {keyspace}.queue_entries WHERE tenant=%s AND queue_id=%s AND bucket=%s",
            (tenant, qid, bucket),
        )
    session.execute(
        f"DELETE FROM {keyspace}.queue_msgids WHERE tenant=%s AND queue_id=%s", (tenant, qid)
    )
    session.execute(
        f"DELETE FROM {keyspace}.queue_state WHERE tenant=%s AND queue_id=%s", (tenant, qid)
    )
    return True
