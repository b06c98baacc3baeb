"""The queue client's appends (`QueueClient.append`, client.py): entries fanned out to the
owners of their queues' partitions, in calls of at most BATCH_BYTES, and sent again when an
owner refused them as not its own (FENCED) or died under the call, once the new owner
announced itself (at most OWNER_WAIT_S). Also `StaleRoutesError`, which client.py exports
with `NewEntry` and `AppendResult` (services/common/queue_entries.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from services.common.bus.unary import APPEND_SUBJECT, DIRECT_APPEND_SUBJECT
from services.common.queue_entries import AppendResult, NewEntry
from services.common.rpc.errors import UnavailableError
from services.common.rpc.limits import split_by_bytes
from services.queue.owner_calls import OwnerCalls, Stub
from services.queue.owners import Owner
from starling.queue.v1 import queue_pb2 as pb

T = TypeVar("T")

# How long an append waits for a queue's new owner (its old one died: the lease runs out,
# another instance claims the partition and announces it) before it answers FENCED.
OWNER_WAIT_S = 3.0


# By wire value: a dict look-up per entry instead of an enum call (0.3 us, measured).
_APPEND_RESULTS = {int(r): r for r in AppendResult}


class StaleRoutesError(Exception):
    """A checked append was refused: the route table version it was chosen with is not the
    current one (services/queue/core.py RouteVersions). `stored` entries of the request,
    from its start, were stored before (calls are split by size); the rest were not."""

    def __init__(self, stored: int) -> None:
        super().__init__(f"stale routes after {stored} entries")
        self.stored = stored


@dataclass(frozen=True, slots=True)
class _Append:
    """One `append` call: what every request it makes carries."""

    tenant: str
    entries: Sequence[NewEntry]
    subject: str
    routes_checked: int
    routes_current: int


def _entry_size(e: NewEntry) -> int:
    # The message, plus the queue id and a few small fields beside it.
    return e.message.ByteSize() + len(e.queue_id) + 16


def _append_request(call: _Append, entries: Sequence[NewEntry]) -> pb.AppendRequest:
    # Each entry added in place: building a NewEntry and then the request copies every
    # message twice (measured: 2x the cost of this per entry).
    req = pb.AppendRequest(
        tenant=call.tenant, routes_checked=call.routes_checked, routes_current=call.routes_current
    )
    add = req.entries.add
    for e in entries:
        add(
            queue_id=e.queue_id,
            message=e.message,
            qos=e.qos,
            retain=e.retain,
            subscription_identifiers=e.subscription_ids,
        )
    return req


async def _outcome(call: Awaitable[T]) -> T | Exception:
    """`call`'s answer or the exception it raised, as `gather(return_exceptions=True)`."""
    try:
        return await call
    except Exception as exc:
        return exc


def _append(s: Stub) -> Any:
    """The method an append calls (the stub is the owner's)."""
    return s.stub.Append


class AppendFanOut:
    """Call `append`; the rest are its steps."""

    def __init__(self, *, calls: OwnerCalls) -> None:
        self._calls = calls

    async def append(
        self,
        tenant: str,
        entries: Sequence[NewEntry],
        routes_checked: int = 0,
        routes_current: int = 0,
    ) -> list[AppendResult]:
        """One result per entry, in order (QueueClient.append says more)."""
        if not entries and not routes_checked:
            return []
        subject = DIRECT_APPEND_SUBJECT if routes_checked else APPEND_SUBJECT
        call = _Append(tenant, entries, subject, routes_checked, routes_current)
        if not entries or self._calls.bus is None:
            return await self._at(None, call, entries)
        await self._calls.follow()
        return await self._to_owners(call)

    async def _to_owners(self, call: _Append) -> list[AppendResult]:
        """Rounds of calls to the owners until every entry has its answer, or the new owner
        of the rest did not announce itself within OWNER_WAIT_S (they stay FENCED: the
        caller tries again later)."""
        out: list[AppendResult] = [AppendResult.FENCED] * len(call.entries)
        todo = list(range(len(call.entries)))
        deadline = 0.0
        while todo:
            moved = self._calls.moved()  # before the calls: a change during them wakes the retry
            todo = await self._round(call, todo, out)
            if not todo:
                break
            now = asyncio.get_running_loop().time()
            deadline = deadline or now + OWNER_WAIT_S
            if now >= deadline:
                break
            await asyncio.wait({moved}, timeout=deadline - now)
            todo.sort()  # each queue's entries stay in request order
        return out

    async def _round(self, call: _Append, todo: list[int], out: list[AppendResult]) -> list[int]:
        """The `todo` entries (indexes) sent, one call per owner, their answers put in `out`;
        the entries to send again (FENCED, or their owner died under the call)."""
        groups = self._by_owner(call, todo)
        calls_of = [self._at(o, call, [call.entries[i] for i in idx]) for o, idx in groups.items()]
        if len(calls_of) == 1:  # one owner (the usual case): no task of its own
            answers: list[Any] = [await _outcome(calls_of[0])]
        else:
            answers = await asyncio.gather(*calls_of, return_exceptions=True)
        again: list[int] = []
        for (owner, idx), answer in zip(groups.items(), answers, strict=True):
            if isinstance(answer, UnavailableError) and owner is not None:
                again += idx  # the owner died under the call: to its successor
            elif isinstance(answer, BaseException):
                raise answer
            else:
                for i, r in zip(idx, answer, strict=True):
                    out[i] = r
                    if r == AppendResult.FENCED:
                        again.append(i)  # not (or no longer) that instance's queue
        return again

    def _by_owner(self, call: _Append, todo: list[int]) -> dict[Owner | None, list[int]]:
        owners = self._calls.owners
        if owners.sole is not None or not owners:
            return {owners.sole: todo}
        groups: dict[Owner | None, list[int]] = {}
        for i in todo:
            groups.setdefault(owners.owner(call.tenant, call.entries[i].queue_id), []).append(i)
        return groups

    async def _at(
        self, owner: Owner | None, call: _Append, entries: Sequence[NewEntry]
    ) -> list[AppendResult]:
        """`entries` at `owner` (None: any instance), in calls of at most BATCH_BYTES (a
        larger entry alone)."""
        results: list[AppendResult] = []
        keys = sorted({(call.tenant, e.queue_id) for e in entries})
        runs = split_by_bytes(entries, _entry_size) if entries else [[]]
        for run in runs:
            req = _append_request(call, run)
            resp = await self._calls.call(
                owner, keys, call.subject, _append, req, pb.AppendResponse
            )
            if resp.stale_routes:
                raise StaleRoutesError(len(results))
            results += [_APPEND_RESULTS[r] for r in resp.results]
        return results
