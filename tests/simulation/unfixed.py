"""Each fix of issue 36 taken out of the REAL store again, one at a time, to show that the
simulation's invariant for it fails without it (tests/simulation/test_sim_queue.py). Each is a
context manager patching exactly the lines of the fix back to what they were before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from services.common.store import cassandra_queue, cassandra_queue_compaction
from services.common.store import cassandra_queue_cql as cql
from services.common.store.cassandra_queue_owner import QueueOwnership


async def _check_then_create(
    self: Any, tenant: str, queue_id: str, partition: int, epoch: int, row: Any
) -> Any:
    """`_owned_state` in the old order: the epoch checked BEFORE the state is created."""
    if row is not None and (row.owner_epoch or 0) >= epoch:
        return row
    await self._cas(self._register, (partition, tenant, queue_id))
    owner = await self._row(self._owner_serial, (partition,))
    if owner is None or owner.epoch != epoch:
        return None
    if row is None:
        await self._cas(self._state_new, (tenant, queue_id))
        row = await self.state_row(tenant, queue_id, serial=True)
    return row


@contextmanager
def without(fix: str) -> Iterator[None]:
    """Run with `fix` removed: "create_before_check", "fence_column", "reader_gaps",
    "expired_condition"."""
    with pytest.MonkeyPatch.context() as mp:
        if fix == "create_before_check":
            mp.setattr(QueueOwnership, "_owned_state", _check_then_create)
        elif fix == "fence_column":  # the claim raises owner_epoch itself, as before
            mp.setattr(
                cql,
                "TAKE",
                "UPDATE queue_log SET owner_epoch=? WHERE tenant=? AND queue_id=? IF owner_epoch<?",
            )
        elif fix == "reader_gaps":  # readers take what a (stale) replica has, gaps and all
            mp.setattr(cassandra_queue, "_contiguous", lambda entries, start: True)
        elif fix == "expired_condition":  # delete by key on the scan's word
            mp.setattr(cassandra_queue_compaction, "EXPIRED_IF", "")
        else:
            raise ValueError(fix)
        yield
