"""Which reader each queue pushes new entries to (in memory, at the owner of the queue's
partition; an instance that loses a partition forgets its readers, and the new owner learns
them from their next reads).

A reader is one delivery of a queue to one connection (a connection node names it in its
Reads). When a reader's Read reaches the end of the queue, it holds the queue's lease: the
queue's next small appends are marked delivered in their own transaction and pushed to it in
the QueueNotice, which saves the reader a Read per notice. Pushes stop at the reader's
`credit`, the room its last Read said it had (its `limit` less the entries it got), so no
more entries are marked delivered than its connection can take; past that the reader reads
again, which renews the credit. A caught-up reader's Ack renews it too (`renew`): the room
its connection has now, less what was pushed to it beyond the highest seq it had received
when it said so. Without that, a steady stream ran the credit out every READ_BATCH entries
and the next message waited for a Read and its commit: at 1,000 msg/s a latency spike every
~100 ms (docs/benchmarks-notes.md).

The lease remembers the delivered mark from when it began (`unsent_after`): every seq above
it was handed, if at all, only to the lease's reader in a push, and that reader knows which
pushed entries it sent (it never reads back what it sent), so its later Reads take the
entries above that mark as first attempts (DUP=0). Any other reader gets the durable mark:
DUP=1 for pushed entries.

Losing this state (a restart), or the reader's node dying, only costs DUP=1 on entries that
were pushed and never sent (at most one credit's worth): the durable mark covers them. A
lease ends when its reader detaches (its connection closed) or the queue is dropped; a reader
that died without detaching keeps it until another reader of the queue reads: at most one
lease per queue.

A Read that was under way when its reader detached ends after the detach: it must not make
that reader the queue's lease holder again (its connection is gone; entries pushed to it
would be marked delivered and come back DUP=1 on the session's next connection). So the
last DETACHED_KEPT detached readers are remembered and never take a lease again (a reader
names one connection's delivery and is never reused).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from services.queue.core import partition_of

# The most a renewal grants (a node's `room`: its client's window, at most a read's worth),
# as a Read's limit is capped (services/queue/consuming.py `MAX_READ`).
MAX_CREDIT = 10_000

# Detached readers remembered (a Read racing its reader's detach lasts a round trip, not
# thousands of other detaches): bounded memory, ~100 bytes each.
DETACHED_KEPT = 10_000


@dataclass(slots=True)
class Lease:
    reader: str
    unsent_after: int
    credit: int  # entries that may still be pushed before the reader reads again
    caught_up: bool = True  # the reader's last read reached the queue's end: push to it
    pushed_through: int = 0  # highest seq pushed to the reader (or read by it)
    reserved: int = 0  # credit taken by appends under way, their seqs not known yet
    # The queue link the reader's last Read or renewing Ack came on (services/queue/link.py):
    # its pushes go there; None: on NATS. It goes with the lease.
    link: Any = None


class Readers:
    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], Lease] = {}
        self._detached: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._leases)

    def get(self, tenant: str, queue_id: str) -> Lease | None:
        return self._leases.get((tenant, queue_id))

    def push(self, tenant: str, queue_id: str, count: int) -> Lease | None:
        """The lease to push `count` new entries to, its credit taken, if its reader is
        caught up and has the room; else None (and the reader reads them back)."""
        lease = self._leases.get((tenant, queue_id))
        if lease is None or not lease.caught_up:
            return None
        if count > lease.credit:
            lease.caught_up = False  # the reader has a gap to read before any push
            return None
        lease.credit -= count
        lease.reserved += count
        return lease

    def pushed(self, lease: Lease, count: int, last_seq: int) -> None:
        """The append that `push` gave `count` of `lease`'s credit to is done: its entries
        (if stored) end at `last_seq`."""
        lease.reserved = max(0, lease.reserved - count)
        lease.pushed_through = max(lease.pushed_through, last_seq)

    def renew(self, tenant: str, queue_id: str, reader: str, room: int, seen_through: int) -> None:
        """`reader`'s connection can take `room` more entries beyond seq `seen_through`
        (the highest it had received; it has no Read under way): its credit is that room less
        the entries pushed to it that it had not received then, and those of appends under
        way. Only for the lease holder while caught up: a reader with a gap reads it first."""
        lease = self._leases.get((tenant, queue_id))
        if lease is None or lease.reader != reader or not lease.caught_up:
            return
        unseen = max(0, lease.pushed_through - seen_through) + lease.reserved
        lease.credit = max(0, min(room, MAX_CREDIT) - unseen)

    def delivered_before(self, tenant: str, queue_id: str, reader: str, durable: int) -> int:
        """The delivered mark a Read by `reader` reports, given the durable one before it."""
        lease = self._leases.get((tenant, queue_id))
        if reader and lease is not None and lease.reader == reader:
            return min(durable, lease.unsent_after)
        return durable

    def read(
        self,
        tenant: str,
        queue_id: str,
        reader: str,
        through: int,
        at_end: bool,
        room: int,
        mark: int | None = None,
    ) -> None:
        """`reader` read (for delivery) through seq `through`; `at_end`: nothing after it;
        `room`: how many more entries it said it could take; `mark`: the delivered mark
        before this read (default `through`). A new lease starts at `mark`: the entries this
        read marked were handed to its reader only, which may read back those it could not
        send yet, and they are still first attempts."""
        key = (tenant, queue_id)
        lease = self._leases.get(key)
        if lease is not None and lease.reader == reader:
            # Pushed while this read was under way, past what it scanned: on their way to the
            # reader too, as are the entries of appends still under way.
            unseen = max(0, lease.pushed_through - through) + lease.reserved
            lease.caught_up = at_end
            lease.credit = max(0, room - unseen)
            lease.pushed_through = max(lease.pushed_through, through)
        elif at_end and reader and reader not in self._detached:
            # A new reader (a new connection of the session): it takes the queue over.
            self._leases[key] = Lease(
                reader, through if mark is None else mark, room, pushed_through=through
            )
        else:
            # Another reader behind: the old one may be gone; push to nobody until one is
            # caught up again.
            self._leases.pop(key, None)

    def missed(self, lease: Lease) -> None:
        """An append was not pushed to `lease`'s reader: a gap to read before any push."""
        lease.caught_up = False

    def detach(self, tenant: str, queue_id: str, reader: str) -> None:
        lease = self._leases.get((tenant, queue_id))
        if lease is not None and lease.reader == reader:
            del self._leases[(tenant, queue_id)]
        self._detached[reader] = None
        if len(self._detached) > DETACHED_KEPT:
            self._detached.popitem(last=False)

    def drop(self, tenant: str, queue_id: str) -> None:
        self._leases.pop((tenant, queue_id), None)

    def drop_partitions(self, partitions: Set[int], count: int) -> None:
        """This instance no longer owns these partitions: forget their queues' leases."""
        for key in [k for k in self._leases if partition_of(*k, count) in partitions]:
            del self._leases[key]
