"""The queue store's port (`QueueStore`): ordered per-session queues under single-writer
partitions with a fencing epoch, kept by the queue service; with the entry row both adapters
write. Every backend passes the contract tests in tests/common/test_store_contract_queue*.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class NewQueueItem:
    message_id: str
    qos: int
    data: bytes  # serialized starling.queue.v1.QueueEntry without seq
    expires_at_ms: int = 0  # 0: never


# A queue's entries are bucketed by seq >> BUCKET_BITS (the Cassandra partition key; SQLite
# keeps the same column so both stores hold the same rows).
BUCKET_BITS = 16


def entry_row(
    tenant: str, queue_id: str, seq: int, item: NewQueueItem
) -> tuple[str, str, int, int, str, int, bytes, int]:
    """The columns of one queue entry, in table order, as both stores write them."""
    return (
        tenant,
        queue_id,
        seq >> BUCKET_BITS,
        seq,
        item.message_id,
        item.qos,
        item.data,
        item.expires_at_ms,
    )


@dataclass(frozen=True, slots=True)
class StoredEntry:
    seq: int
    qos: int
    data: bytes
    expires_at_ms: int
    released: bool


class AppendOutcome:
    OK = "ok"
    DUPLICATE = "duplicate"  # same message_id already in the queue: not appended again
    FULL = "full"  # reject-newest policy at the depth limit
    FENCED = "fenced"  # another instance owns the partition now
    OVER_BYTES = "over_bytes"  # the tenant's max_queued_bytes: no room left (not stored)


@dataclass(frozen=True, slots=True)
class AppendReport:
    """What one append did: an `AppendOutcome` per item, the queue's last seq after it, how
    many entries the depth limit dropped (oldest removed or newest refused), and how much the
    queue's depth and held bytes changed (its counters after minus before, in the append's
    transaction)."""

    outcomes: list[str]
    last_seq: int = 0
    dropped: int = 0
    depth_change: int = 0
    bytes_change: int = 0  # the same for the queue's held bytes (`QueueState.bytes`)


class QueueChange(NamedTuple):
    """How much a write changed a queue's counters (after minus before, in its transaction):
    entries and held bytes."""

    depth: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class QueueState:
    last_seq: int
    acked_through: int
    depth: int
    dropped: int
    # The highest seq ever handed to a connection for delivery: entries above it have never
    # been sent, so their first PUBLISH carries DUP=0 [MQTT-3.3.1-1].
    delivered_through: int = 0
    # The bytes the queue holds for its readers: the sum of its unacknowledged entries'
    # `NewQueueItem.data` lengths (the tenant's max_queued_bytes counts these).
    bytes: int = 0


class QueueStore(Protocol):
    """Ordered per-session queues under single-writer partitions with a fencing epoch."""

    async def claim_partition(self, partition: int) -> int:
        """Become the owner of `partition`; returns the new epoch (older owners are fenced)."""

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
        """Append in order, in one transaction. `room_bytes` (None: no cap): the bytes the
        tenant may still queue; a new entry whose data would take the appended ones past it
        is OVER_BYTES (not stored; duplicates take no room). With `mark_delivered` (the queue
        pushes the new entries to a reader) delivered_through is raised to the new last seq,
        durably, before this returns."""

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        """Up to `limit` entries from `from_seq` on (expired ones included), whose data add
        up to at most `max_bytes` (0: no cap; the first entry always comes, however large,
        so a big entry still moves), and the queue's
        state from BEFORE this read. With `mark_delivered`, delivered_through is raised to the
        last entry returned, durably, before this returns: the caller writes the entries only
        afterwards, so a later reader never takes an entry that was sent for a first attempt."""

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        """Acknowledge the entries up to `through_seq`; returns the change of the queue's
        depth and bytes (<= 0)."""

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None: ...

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        """Remove the whole queue; returns the change of depth and bytes (minus what it
        held)."""

    async def depths(self) -> list[tuple[str, str, int, int]]:
        """(tenant, queue id, depth, bytes) of every queue holding entries: one scan of the
        queues' state, for the per-tenant totals the queue service keeps (at start, and now
        and then to take in what others changed: compaction, an ack served by a non-owner)."""

    async def state(self, tenant: str, queue_id: str) -> QueueState: ...

    async def close(self) -> None: ...
