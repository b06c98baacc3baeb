"""This queue instance's partitions: leases (services/queue/leases.py), fencing epochs, the
write lock of each partition, and the announcements callers route by.

Invariants:
- An append to a partition runs under the partition's lock with the epoch its claim took;
  without an epoch (not ours, given up, or fenced by a newer claim) every entry is FENCED,
  which callers retry at the owner.
- A partition is given up (the fair share shrank: an instance joined) by dropping its epoch
  under its lock, so an append under way finishes first and none starts after; only then is
  the lease released for another instance to claim. A lease that was lost (taken by another
  after this instance was silent for a ttl) drops the epoch at once: the new owner's claim has
  already fenced this one in the store.
- Whenever the set changes, and every second, the instance announces what it owns with the
  epochs (services/queue/owners.py says how callers read that).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from services.common.store.ports_queue import QueueStore
from services.queue.config import QueueSettings
from services.queue.leases import LeaseTable
from starling.queue.v1 import queue_pb2 as pb

log = logging.getLogger("starling.queue.ownership")

ANNOUNCE_EVERY_S = 1.0


class Partitions:
    """This instance's partitions and their fencing epochs."""

    def __init__(
        self,
        *,
        settings: QueueSettings,
        instance_id: str,
        leases: LeaseTable,
        store: QueueStore,
        grpc_address: str = "",
        on_lost: Callable[[set[int]], None] = lambda _: None,
        publish: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        """`on_lost(partitions)`: this instance stopped owning them (their readers and depths
        go); `publish(announcement)`: the owners' announcement on NATS (None: not sent)."""
        self.count = settings.queue_partitions
        self.index = settings.instance_index
        self.instances = settings.instance_count
        self.instance_id = instance_id
        self.grpc_address = grpc_address
        self.link_address = ""  # set once the queue link listens
        self.epochs: dict[int, int] = {}
        self.locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._leases = leases
        self._store = store
        self._tick_s = settings.queue_lease_ttl_ms / 4000
        self._announced = 0.0
        self.on_lost = on_lost
        self.publish = publish

    def owns(self, partition: int) -> bool:
        return partition in self.epochs

    def fenced(self, partition: int) -> None:
        """The store refused this instance's epoch: another instance claimed the partition.
        Claimed again at the next round if the lease is still this instance's."""
        if self.epochs.pop(partition, None) is not None:
            log.warning("partition_fenced", extra={"partition": partition})
            self.on_lost({partition})

    async def tick(self) -> bool:
        """One round of leases: claim what was gained, give up the excess, forget what was
        lost; True if the owned set changed."""
        view = await self._leases.tick()
        held = set(self.epochs)
        lost = held - view.owned
        for p in lost:
            self.epochs.pop(p, None)
        for p in sorted(view.owned - held):
            async with self.locks[p]:
                self.epochs[p] = await self._store.claim_partition(p)
        excess = sorted(view.owned, reverse=True)[: max(0, len(view.owned) - view.share)]
        for p in excess:
            async with self.locks[p]:  # appends under way finish first
                self.epochs.pop(p, None)
        if excess:
            await self._leases.release(excess)
            lost |= set(excess)
        if lost:
            self.on_lost(lost)
        changed = held != set(self.epochs)
        if changed:
            log.info(
                "queue_partitions_changed",
                extra={"owned": len(self.epochs), "share": view.share, "members": view.members},
            )
        return changed

    async def run(self) -> None:
        """Lease rounds until cancelled. A failed round (Redis away) keeps what is held:
        the epochs still fence this instance if another claims meanwhile."""
        while True:
            try:
                changed = await self.tick()
                if changed or time.monotonic() - self._announced >= ANNOUNCE_EVERY_S:
                    await self.announce()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("queue_lease_round_failed", extra={"error": repr(exc)})
            await asyncio.sleep(self._tick_s)

    def announcement(self, leaving: bool = False) -> pb.QueueOwners:
        owned = [] if leaving else sorted(self.epochs)
        return pb.QueueOwners(
            instance_id=self.instance_id,
            partition_count=self.count,
            partitions=owned,
            epochs=[self.epochs[p] for p in owned],
            grpc_address=self.grpc_address,
            link_address=self.link_address,
            leaving=leaving,
        )

    async def announce(self, leaving: bool = False) -> None:
        if self.publish is not None:
            self._announced = time.monotonic()
            await self.publish(self.announcement(leaving).SerializeToString())

    async def leave(self) -> None:
        """Graceful stop (the servers stopped taking calls): give every partition up at
        once, so the others take them over without waiting for the leases to run out."""
        owned = sorted(self.epochs)
        for p in owned:
            async with self.locks[p]:
                self.epochs.pop(p, None)
        try:
            await self._leases.release(owned)
            await self._leases.leave()
            await self.announce(leaving=True)
        except Exception as exc:  # the leases run out instead
            log.warning("queue_leave_failed", extra={"error": repr(exc)})
