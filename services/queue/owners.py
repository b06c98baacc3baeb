"""Which queue instance owns each partition, as its callers (router, connection nodes) see it.

Queue instances announce their partitions (`QueueOwners` on ctl.queue.owners) when they change
and every second. A claim raises the partition's fencing epoch in the store, so for each
partition the announcement with the highest epoch names the current owner, whatever order
announcements of different instances arrive in. A map that is behind only costs a retry: the
instance it names refuses an append for a partition it no longer owns (FENCED), and the caller
waits for the next announcement.

Pure: no I/O; the client (services/queue/client.py) feeds it announcements.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.queue.core import partition_of
from starling.queue.v1 import queue_pb2 as pb


@dataclass(frozen=True, slots=True)
class Owner:
    instance_id: str
    grpc_address: str
    link_address: str = ""


class OwnerMap:
    def __init__(self) -> None:
        self.partitions = 0  # 0: no announcement yet
        self._owner: dict[int, tuple[int, Owner]] = {}  # partition -> (epoch, owner)
        self._sole: Owner | None = None  # the one owner of every partition, if there is one

    def __bool__(self) -> bool:
        return bool(self._owner)

    def learn(self, ann: pb.QueueOwners) -> bool:
        """Take in one announcement; True if any partition's owner changed."""
        if ann.partition_count != self.partitions:
            # A new partition count (a redeployment): what was known does not apply.
            self.partitions = ann.partition_count
            self._owner.clear()
        owner = Owner(ann.instance_id, ann.grpc_address, ann.link_address)
        changed = False
        claimed = set()
        if not ann.leaving:
            for p, epoch in zip(ann.partitions, ann.epochs, strict=True):
                claimed.add(p)
                known = self._owner.get(p)
                if known is None or epoch > known[0] or (epoch == known[0] and known[1] != owner):
                    changed |= known is None or known[1] != owner
                    self._owner[p] = (epoch, owner)
        # Partitions this instance no longer announces: it released them.
        for p, (_, o) in list(self._owner.items()):
            if o.instance_id == ann.instance_id and p not in claimed:
                del self._owner[p]
                changed = True
        if changed:
            self._sole = self._only_owner()
        return changed

    def _only_owner(self) -> Owner | None:
        owners = {o for _, o in self._owner.values()}
        if len(owners) == 1 and len(self._owner) == self.partitions:
            return next(iter(owners))
        return None

    @property
    def sole(self) -> Owner | None:
        """The instance that owns every partition (one queue instance), else None."""
        return self._sole

    def owner(self, tenant: str, queue_id: str) -> Owner | None:
        if self._sole is not None:
            return self._sole
        if not self.partitions:
            return None
        known = self._owner.get(partition_of(tenant, queue_id, self.partitions))
        return None if known is None else known[1]

    def link_addresses(self) -> set[str]:
        """The queue links of the instances that own partitions now."""
        return {o.link_address for _, o in self._owner.values() if o.link_address}

    def owner_ids(self) -> set[str]:
        """Every instance that owns a partition now."""
        return {o.instance_id for _, o in self._owner.values()}

    def complete(self) -> bool:
        """Every partition has a known owner."""
        return bool(self.partitions) and len(self._owner) == self.partitions
