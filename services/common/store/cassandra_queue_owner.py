"""Partition ownership of the Cassandra queue store: claiming a partition (a new fencing
epoch) and the fence every owner write carries.

Strict fencing (issues 13 and 36): once `claim_partition` returned epoch e+1, no write of
epoch e changes a queue of the partition. The claim is a compare-and-set on partition_owner
that names its holder (so a claim whose outcome the driver could not tell, a CAS WriteTimeout,
is settled by a serial read instead of guessed); then it *takes* every queue registered under
the partition: `fence` (a static column of the queue's partition) raised with a
compare-and-set, which makes every append of an older epoch fail its condition (`fence <=
epoch`). A writer's
first write of its epoch to a queue registers the queue (an LWT), CREATES the queue's state if
it has none (fence and owner 0), and only then reads the partition's epoch at serial
consistency; either that read comes before the claim (so the claim lists the registration and
takes the state, which exists by then) or it sees the new epoch (FENCED). Only the append's
compare-and-set, after that check passed, sets owner_epoch to the writer's epoch (a claim
raises `fence`, never owner_epoch), so a state whose owner_epoch is the writer's own proves
the check passed once (a check cut short by a timeout is simply made again). The old
order, checking before creating, let an old owner create a queue the claim had found empty
and append to it after the claim returned. Two first versions of this fix failed in
tests/simulation: creating the state already owned let a check cut short by a timeout be
skipped on the retry, and a take raising owner_epoch let a stale claim (paused, finishing
after a newer one) pass for that check.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from cassandra import WriteTimeout, WriteType

from services.common.store import cassandra_queue_cql as cql
from services.common.store.cassandra import CassandraBase


class QueueOwnership(CassandraBase):
    """The claim and fencing half of the queue store (module docstring)."""

    def _prepare_owner(self, p: Callable[[str], Any]) -> None:
        self._owner_get = p(cql.OWNER_GET)
        self._owner_serial = p(cql.OWNER_GET)
        self._owner_serial.consistency_level = self._serial_cl
        self._owner_set = p(cql.OWNER_SET)
        self._owner_new = p(cql.OWNER_NEW)
        self._register = p(cql.REGISTER)
        self._registered = p(cql.REGISTERED)
        self._registered.consistency_level = self._serial_cl
        self._take_one = p(cql.TAKE)
        self._state_new = p(cql.STATE_NEW)
        self._state_get = p(cql.STATE_GET)
        self._state_serial = p(cql.STATE_GET)
        self._state_serial.consistency_level = self._serial_cl

    async def _row(self, stmt: Any, args: tuple[Any, ...]) -> Any:
        rows = await self._exec(stmt, args)
        return rows[0] if rows else None

    async def _cas(self, stmt: Any, args: tuple[Any, ...]) -> list[Any] | None:
        """A lightweight transaction's result rows; None when the driver cannot tell whether
        it applied (WriteTimeout of write type CAS: a serial read settles it)."""
        try:
            return await self._exec(stmt, args)
        except WriteTimeout as exc:
            if exc.write_type == WriteType.CAS:
                return None
            raise

    async def state_row(self, tenant: str, queue_id: str, serial: bool = False) -> Any:
        """The queue's state (static columns); None when it has none."""
        stmt = self._state_serial if serial else self._state_get
        row = cql.live(await self._row(stmt, (tenant, queue_id)))
        if row is not None and not serial and not cql.whole(row):
            # One replica (a read at ONE) can hold a later transaction's columns without an
            # earlier one's: ask again linearizably.
            return await self.state_row(tenant, queue_id, serial=True)
        return row

    async def claim_partition(self, partition: int) -> int:
        me = uuid.uuid4().hex
        unsure = False
        while True:
            row = await self._row(self._owner_serial if unsure else self._owner_get, (partition,))
            if unsure and row is not None and row.holder == me:
                epoch = int(row.epoch)  # the claim whose answer was lost did apply
            elif row is None:
                res = await self._cas(self._owner_new, (partition, me))
                unsure = res is None
                if not cql.applied(res or []):
                    continue
                epoch = 1
            else:
                res = await self._cas(self._owner_set, (row.epoch + 1, me, partition, row.epoch))
                unsure = res is None
                if not cql.applied(res or []):
                    continue
                epoch = int(row.epoch + 1)
            await self._take(partition, epoch)
            return epoch

    async def _take(self, partition: int, epoch: int) -> None:
        """Raise every registered queue of the partition to `epoch` (module docstring)."""
        queues = [(r.tenant, r.queue_id) for r in await self._exec(self._registered, (partition,))]
        for i in range(0, len(queues), cql.TAKE_AT_ONCE):
            await asyncio.gather(
                *(self._take_queue(t, q, epoch) for t, q in queues[i : i + cql.TAKE_AT_ONCE])
            )

    async def _take_queue(self, tenant: str, queue_id: str, epoch: int) -> None:
        """fence >= `epoch` on the queue's state, or no state at all (a creation after
        this is checked by its writer's serial read)."""
        while True:
            res = await self._cas(self._take_one, (epoch, tenant, queue_id, epoch))
            if res is not None:
                return  # applied, or fence >= epoch already, or no state
            row = await self.state_row(tenant, queue_id, serial=True)
            if row is None or (row.fence or 0) >= epoch:
                return

    async def _owned_state(
        self, tenant: str, queue_id: str, partition: int, epoch: int, row: Any
    ) -> Any:
        """The state `epoch` may write to (`row` as read, created if None), or None when the
        epoch no longer owns the partition (module docstring: register, create, then check)."""
        if row is not None and (row.owner_epoch or 0) >= epoch:
            return row  # its first write was checked (or a newer epoch's: the CAS fails)
        if await self._cas(self._register, (partition, tenant, queue_id)) is None:
            return await self._owned_state(tenant, queue_id, partition, epoch, row)
        if row is None:
            await self._cas(self._state_new, (tenant, queue_id))
            row = await self.state_row(tenant, queue_id, serial=True)
            if row is None:  # dropped right after: create it again
                return await self._owned_state(tenant, queue_id, partition, epoch, None)
        owner = await self._row(self._owner_serial, (partition,))
        if owner is None or owner.epoch != epoch:
            return None
        return row
