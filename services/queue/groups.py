"""The hand-out of a durable shared group's queue to its members, at the queue's owner.

A group's queue (services/common/group_routes.py) is appended to like a session's; what
differs is the reading. Several members, on any nodes, read it at once: each `claim` hands
the caller entries no other member holds, as many as it asks (its free window: flow control
stays with the member), and each entry is acknowledged on its own (`done`). The queue's
`acked_through` is raised, and the store trimmed, through the highest seq below which every
entry is done, so the store never forgets an entry a member has not acknowledged.

Invariants:
- Claims live in the owner's memory only. A member that detaches (its connection ended, or
  it unsubscribed), or that has not called for MEMBER_TTL_S (its node died), gives its
  unacknowledged claims back: they go to the next member that reads, first, with DUP=1.
- A new owner (the old one died or gave the partition up) starts from the stored
  `acked_through`: what was claimed and not acknowledged is handed out again. Nothing
  acknowledged to a publisher is lost; a member may get an entry twice only across such a
  change, which QoS 1 allows.
- Only the owner claims and acknowledges: an instance that does not own the partition
  answers a claim with nothing and ignores acks (an ack there could raise `acked_through`
  past an entry the owner has handed to a member that has not acknowledged it).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.common import clock
from services.common.rpc.limits import BATCH_BYTES
from services.common.store.ports_queue import QueueChange, QueueStore, StoredEntry
from services.queue.core import partition_of
from services.queue.ownership import Partitions

# A member silent this long (no claim, no ack) has gone with its node: its claims go back.
# Its node renews well within it (a connected member's delivery polls at most every ~19 s).
MEMBER_TTL_S = 60.0


@dataclass(slots=True)
class GroupState:
    """One group queue's hand-out, as this owner (at `epoch`) knows it."""

    epoch: int
    acked_through: int
    cursor: int  # the next seq never handed out by this owner
    high: int  # the highest seq handed out by this owner (entries at or below: DUP=1)
    claims: dict[int, str] = field(default_factory=dict)  # seq -> member holding it
    returned: list[int] = field(default_factory=list)  # heap: seqs to hand out again
    done: set[int] = field(default_factory=set)  # acknowledged above acked_through
    seen: dict[str, float] = field(default_factory=dict)  # member -> last call (monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim handed a member: its entries (unexpired), the queue's acked_through,
    and the highest seq handed out before this claim (DUP at or below it)."""

    entries: list[StoredEntry]
    acked_through: int
    delivered_through: int


# Writes an ack through the queue's depth accounting (consuming.py `_counted`).
Counted = Callable[[str, str, Awaitable[QueueChange]], Awaitable[None]]
# Announces that a group's queue has entries to hand out again (returned claims), or
# (`dropped=True`) that it was dropped.
Announce = Callable[..., Awaitable[None]]


class GroupDispatch:
    def __init__(
        self, *, store: QueueStore, parts: Partitions, counted: Counted, announce: Announce
    ) -> None:
        self._store = store
        self._parts = parts
        self._counted = counted
        self._announce = announce
        self._groups: dict[tuple[str, str], GroupState] = {}

    def _epoch(self, tenant: str, qid: str) -> int | None:
        return self._parts.epochs.get(partition_of(tenant, qid, self._parts.count))

    async def _state(self, tenant: str, qid: str) -> GroupState | None:
        """The group's state if this instance owns its partition (fresh after a change of
        owner), else None (and whatever was known is forgotten)."""
        epoch = self._epoch(tenant, qid)
        key = (tenant, qid)
        g = self._groups.get(key)
        if epoch is None:
            self._groups.pop(key, None)
            return None
        if g is None or g.epoch != epoch:
            st = await self._store.state(tenant, qid)
            g = self._groups.get(key)  # another call may have made it meanwhile
            if g is None or g.epoch != epoch:
                at = st.acked_through
                g = self._groups[key] = GroupState(epoch, at, at + 1, st.delivered_through)
        return g

    async def claim(self, tenant: str, qid: str, member: str, limit: int) -> Claimed:
        """Up to `limit` entries for `member` (0: it only says it is alive)."""
        g = await self._state(tenant, qid)
        if g is None:
            return Claimed([], 0, 0)
        async with g.lock:
            if self._expire(g) and g.returned:
                await self._announce(tenant, qid)
            g.seen[member] = time.monotonic()
            high = g.high
            out: list[StoredEntry] = []
            if limit > 0:
                await self._again(g, tenant, qid, member, limit, out)
                if len(out) < limit:
                    await self._fresh(g, tenant, qid, member, limit - len(out), out)
            await self._advance(g, tenant, qid)
            now_ms = clock.now_ms()
            live = []
            for e in out:
                if e.expires_at_ms and e.expires_at_ms <= now_ms:  # never delivered: done
                    g.claims.pop(e.seq, None)
                    g.done.add(e.seq)
                else:
                    live.append(e)
            return Claimed(live, g.acked_through, high)

    async def _again(
        self, g: GroupState, tenant: str, qid: str, member: str, limit: int, out: list[StoredEntry]
    ) -> None:
        """Entries given back by members that left, lowest seq first."""
        while g.returned and len(out) < limit:
            seq = heapq.heappop(g.returned)
            if seq <= g.acked_through or seq in g.done or seq in g.claims:
                continue
            entries, _ = await self._store.read(tenant, qid, seq, 1)
            if entries and entries[0].seq == seq:
                g.claims[seq] = member
                out.append(entries[0])
            else:
                g.done.add(seq)  # gone from the store (expired): nothing to hand out

    async def _fresh(
        self, g: GroupState, tenant: str, qid: str, member: str, limit: int, out: list[StoredEntry]
    ) -> None:
        """Entries never handed out by this owner, from its cursor on."""
        entries, st = await self._store.read(tenant, qid, g.cursor, limit, max_bytes=BATCH_BYTES)
        if st.last_seq + 1 < g.cursor or st.acked_through < g.acked_through:
            # Dropped (by another instance: its last member left) and begun again.
            g.acked_through, g.cursor, g.high = st.acked_through, st.acked_through + 1, 0
            g.claims.clear()
            g.returned.clear()
            g.done.clear()
            entries, st = await self._store.read(
                tenant, qid, g.cursor, limit, max_bytes=BATCH_BYTES
            )
        if st.acked_through > g.acked_through:  # (acked by an earlier owner)
            g.acked_through = st.acked_through
        for e in entries:
            for missing in range(g.cursor, e.seq):  # a gap (trimmed): nothing to wait for
                g.done.add(missing)
            g.cursor = e.seq + 1
            g.high = max(g.high, e.seq)
            if e.seq in g.done or e.seq <= g.acked_through:
                continue  # acknowledged to an earlier owner's hand-out
            g.claims[e.seq] = member
            out.append(e)

    async def done(self, tenant: str, qid: str, member: str, seqs: list[int]) -> bool:
        """`member` acknowledged these entries (the client's PUBACK, PUBREC or PUBCOMP);
        False (nothing done) at an instance that does not own the queue."""
        g = await self._state(tenant, qid)
        if g is None:
            return False
        async with g.lock:
            g.seen[member] = time.monotonic()
            for seq in seqs:
                g.claims.pop(seq, None)
                if seq > g.acked_through:
                    g.done.add(seq)
            await self._advance(g, tenant, qid)
        return True

    async def detach(self, tenant: str, qid: str, member: str) -> None:
        """`member` stopped reading: its claims go to the other members."""
        g = await self._state(tenant, qid)
        if g is None:
            return
        async with g.lock:
            g.seen.pop(member, None)
            back = self._give_back(g, {member})
        if back:
            await self._announce(tenant, qid)

    def forget(self, tenant: str, qid: str) -> None:
        """The group's queue was dropped."""
        self._groups.pop((tenant, qid), None)

    def _expire(self, g: GroupState) -> int:
        """Give back the claims of members silent for MEMBER_TTL_S."""
        cutoff = time.monotonic() - MEMBER_TTL_S
        gone = {m for m, at in g.seen.items() if at < cutoff}
        for m in gone:
            del g.seen[m]
        return self._give_back(g, gone) if gone else 0

    def _give_back(self, g: GroupState, members: set[str]) -> int:
        back = [seq for seq, m in g.claims.items() if m in members]
        for seq in back:
            del g.claims[seq]
            heapq.heappush(g.returned, seq)
        return len(back)

    async def _advance(self, g: GroupState, tenant: str, qid: str) -> None:
        """Raise acked_through over the done entries in a row; trim the store."""
        through = g.acked_through
        while through + 1 in g.done:
            through += 1
            g.done.discard(through)
        if through > g.acked_through:
            g.acked_through = through
            await self._counted(tenant, qid, self._store.ack(tenant, qid, through))
