"""The router pipeline: batches in order, acks released per message, retries with the same
message ids, and publishers disconnected (not acked) when the router stays away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from services.common.rpc.errors import UnavailableError
from services.common.rpc.limits import BATCH_BYTES
from services.connection.routing import MAX_BATCH, RoutingPipeline
from services.router.client import RouteResult
from starling.common.v1.message_pb2 import RoutedMessage
from tests.poll import eventually


class FakeRouter:
    def __init__(self, answers: list[object]) -> None:
        self.answers = answers  # per call: a RouteResult for every message, or an exception
        self.calls: list[list[str]] = []

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        self.calls.append([m.message_id for m in messages])
        answer = self.answers.pop(0) if self.answers else RouteResult.STORED
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, RouteResult):
            return [answer] * len(messages)
        return list(answer)  # type: ignore[call-overload]


def _env(i: int) -> RoutedMessage:
    return RoutedMessage(tenant="t", topic="a", message_id=f"m{i}")


async def _run(pipeline: RoutingPipeline[str], until: Callable[[], bool]) -> None:
    task = asyncio.ensure_future(pipeline.run())
    try:
        await eventually(until, 10, "the pipeline finished", every_s=0.01)
    finally:
        task.cancel()


async def test_every_message_is_acked_in_order_and_batches_are_bounded() -> None:
    done: list[tuple[str | None, int, RouteResult]] = []
    router = FakeRouter([])
    p: RoutingPipeline[str] = RoutingPipeline(
        router, lambda c, pid, r: done.append((c, pid, r)), print
    )
    n = MAX_BATCH + 10
    for i in range(n):
        p.submit("pub", i + 1, _env(i))
    await _run(p, lambda: len(done) == n)
    assert [pid for _, pid, _ in done] == list(range(1, n + 1))
    assert [len(c) for c in router.calls] == [MAX_BATCH, 10]


async def test_try_later_and_errors_are_retried_with_the_same_message_ids() -> None:
    done: list[int] = []
    answers: list[object] = [
        UnavailableError("router down"),  # what the router client raises
        [RouteResult.STORED, RouteResult.TRY_LATER, RouteResult.QUOTA_EXCEEDED],
    ]
    router = FakeRouter(answers)
    p: RoutingPipeline[str] = RoutingPipeline(router, lambda c, pid, r: done.append(pid), print)
    for i in range(3):
        p.submit("pub", i + 1, _env(i))
    await _run(p, lambda: len(done) == 3)
    assert router.calls == [["m0", "m1", "m2"], ["m0", "m1", "m2"], ["m1"]]
    assert sorted(done) == [1, 2, 3]


async def test_publishers_are_given_up_when_the_router_stays_away() -> None:
    done: list[int] = []
    gave_up: list[str | None] = []
    router = FakeRouter([UnavailableError("down")] * 100)
    p: RoutingPipeline[str] = RoutingPipeline(
        router, lambda c, pid, r: done.append(pid), gave_up.append, give_up_s=0.1
    )
    p.submit("a", 1, _env(1))
    p.submit("b", 2, _env(2))
    await _run(p, lambda: len(gave_up) == 2)
    assert done == [] and gave_up == ["a", "b"]


class PickyRouter:
    """Stores every message except those whose id starts with a refused prefix (TRY_LATER
    until `heal()`), recording the order in which messages were stored."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.stored: list[str] = []
        self.calls: list[int] = []  # bytes per call

    def heal(self) -> None:
        self.refused = "\0"

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        self.calls.append(sum(m.ByteSize() for m in messages))
        out = []
        for m in messages:
            if m.message_id.startswith(self.refused):
                out.append(RouteResult.TRY_LATER)
            else:
                self.stored.append(m.message_id)
                out.append(RouteResult.STORED)
        return out


async def test_a_failing_publisher_does_not_hold_up_the_others_and_keeps_its_order() -> None:
    """Head-of-line blocking: the bad publisher's unstored message waits in its own lane, its
    later messages queue behind it (order per publisher), everyone else is acked at once."""
    done: list[tuple[str | None, int]] = []
    router = PickyRouter("bad-0")
    p: RoutingPipeline[str] = RoutingPipeline(
        router, lambda c, pid, r: done.append((c, pid)), print
    )
    task = asyncio.ensure_future(p.run())
    try:
        p.submit("bad", 1, RoutedMessage(tenant="a", message_id="bad-0"))
        await eventually(lambda: router.calls, 5, "bad-0 at the router", every_s=0.01)
        p.submit("good", 1, RoutedMessage(tenant="b", message_id="good-0"))
        p.submit("bad", 2, RoutedMessage(tenant="a", message_id="bad-1"))
        for i in range(1, 50):
            p.submit("good", i + 1, RoutedMessage(tenant="b", message_id=f"good-{i}"))
        await eventually(lambda: len(done) == 50, 5, "the 50 good ones done", every_s=0.01)
        assert [pid for c, pid in done if c == "good"] == list(range(1, 51))
        assert not [d for d in done if d[0] == "bad"]  # bad-1 waits behind bad-0
        assert len(p) == 2
        router.heal()
        await eventually(lambda: len(done) == 52, 5, "the two bad ones done", every_s=0.01)
        assert [pid for c, pid in done if c == "bad"] == [1, 2]
        assert [m for m in router.stored if m.startswith("bad")] == ["bad-0", "bad-1"]
        assert len(p) == 0
    finally:
        task.cancel()


async def test_batches_are_cut_by_bytes_and_a_big_message_goes_alone() -> None:
    done: list[int] = []
    router = PickyRouter("\0")
    p: RoutingPipeline[str] = RoutingPipeline(router, lambda c, pid, r: done.append(pid), print)
    big = BATCH_BYTES + 10
    for i in range(6):
        size = big if i in (2, 3) else BATCH_BYTES // 3
        p.submit("pub", i + 1, RoutedMessage(message_id=f"m{i}", payload=bytes(size)))
    await _run(p, lambda: len(done) == 6)
    assert done == [1, 2, 3, 4, 5, 6]
    assert len(router.calls) == 4  # [m0 m1] [m2] [m3] [m4 m5]
    assert max(router.calls) < big + 100
