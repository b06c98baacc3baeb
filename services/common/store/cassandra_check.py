"""Queue-store checks an operator can run against a live cluster (for a `starling store
check` command): a handful of the queue contract's promises, on a throw-away tenant and a
partition number no queue service uses (negative), so nothing real is fenced or touched.
tests/simulation runs the same checks on its model of Cassandra.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.common.store.ports_queue import AppendOutcome, NewQueueItem, QueueStore


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    detail: str = ""


def _items(prefix: str, n: int) -> list[NewQueueItem]:
    return [NewQueueItem(f"{prefix}{i}", 1, f"{prefix}{i}".encode()) for i in range(n)]


async def _order(store: QueueStore, tenant: str, part: int) -> str:
    epoch = await store.claim_partition(part)
    await store.append(tenant, "order#1", _items("m", 5), part, epoch, 0, True)
    await store.ack(tenant, "order#1", 2)
    entries, st = await store.read(tenant, "order#1", 1, 100)
    if [e.seq for e in entries] != [3, 4, 5] or st.acked_through != 2:
        return f"read after ack 2 gave {[e.seq for e in entries]}, acked_through {st.acked_through}"
    return ""


async def _fencing(store: QueueStore, tenant: str, part: int) -> str:
    old = await store.claim_partition(part)
    new = await store.claim_partition(part)
    late = await store.append(tenant, "fence#1", _items("old", 1), part, old, 0, True)
    if late.outcomes != [AppendOutcome.FENCED]:
        return f"an append of epoch {old} after epoch {new} was claimed: {late.outcomes}"
    st = await store.state(tenant, "fence#1")
    return f"the fenced append changed the queue: {st}" if st.last_seq else ""


async def _idempotent(store: QueueStore, tenant: str, part: int) -> str:
    epoch = await store.claim_partition(part)
    await store.append(tenant, "dup#1", _items("d", 2), part, epoch, 0, True)
    again = await store.append(tenant, "dup#1", _items("d", 3), part, epoch, 0, True)
    want = [AppendOutcome.DUPLICATE] * 2 + [AppendOutcome.OK]
    return "" if again.outcomes == want else f"a retried append gave {again.outcomes}"


async def _drop(store: QueueStore, tenant: str, part: int) -> str:
    epoch = await store.claim_partition(part)
    await store.append(tenant, "drop#1", _items("x", 3), part, epoch, 0, True)
    await store.drop(tenant, "drop#1")
    entries, st = await store.read(tenant, "drop#1", 1, 100)
    return "" if not entries and st.last_seq == 0 else f"after a drop: {len(entries)} entries"


CHECKS: dict[str, Callable[[QueueStore, str, int], Awaitable[str]]] = {
    "append, read and ack in order": _order,
    "a claimed partition fences the old epoch": _fencing,
    "a retried append is a duplicate": _idempotent,
    "a dropped queue is empty": _drop,
}


async def check_queue_store(store: QueueStore) -> list[CheckResult]:
    """Run every check (each on its own partition); one result per check, failures with
    what was seen (an exception counts as a failure, named)."""
    tenant = f"starling-check-{uuid.uuid4().hex[:8]}"
    out = []
    for i, (name, check) in enumerate(CHECKS.items()):
        part = -1_000_000 - uuid.uuid4().int % 1_000_000 - i  # never a real partition
        try:
            detail = await check(store, tenant, part)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
        out.append(CheckResult(name, not detail, detail))
    return out
