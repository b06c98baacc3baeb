"""A connection that ends with a delayed will is let go (released to the session service,
its takeover's kick answered) only once the router holds the will, within the bound: a
client back at once, on any node, then finds it at the router to cancel or publish now
(services/connection/settling.py, wills.py). Before, a clean start on another node could
settle before the will arrived, and the router then held it for its whole delay."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.common.bus.ids import MessageIds
from services.common.connect import ConnectOutcome
from services.common.mqtt import Connect, Properties, Will, encode
from services.common.route_table import RouteResult
from services.common.tasks import TaskSet
from services.connection.settling import SettlingConnections
from services.connection.wills import Wills
from starling.common.v1.message_pb2 import RoutedMessage
from tests.connection.harness import new_channel
from tests.poll import eventually, holds_within_async


class _HeldRouter:
    """A router whose answers wait until the test lets them go (busy or slow, as a real one
    can be): only its timing, no logic of its own."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.got: list[RoutedMessage] = []

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        self.got.extend(messages)
        await self.go.wait()
        return [RouteResult.STORED] * len(messages)


def _ended_with_a_delayed_will(wills: Wills) -> asyncio.Task[None] | None:
    """A client with a 30 s Will Delay Interval and a 60 s session, its socket lost."""
    ch = new_channel()
    will = Will("status/c", b"gone", 1, properties=Properties(will_delay_interval=30))
    props = Properties(session_expiry_interval=60)
    ch.receive(encode(Connect("c", 5, will=will, properties=props), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, session_expiry_s=60), 0.0)
    ch.connection_lost()
    return wills.connection_ended(ch)


def _wills(router: _HeldRouter) -> Wills:
    return Wills(node_id="n", publish=print, router=router, tasks=TaskSet(), ids=MessageIds("n", 1))


async def test_release_and_kick_reply_wait_until_the_router_holds_the_delayed_will() -> None:
    router = _HeldRouter()
    settling = SettlingConnections(settle_s=10.0)
    will = _ended_with_a_delayed_will(_wills(router))
    assert will is not None
    settling.hold_will(("t", "c"), will)
    released: list[str] = []
    release = asyncio.ensure_future(
        settling.release_when_settled(("t", "c"), None, None, lambda: released.append("c"))
    )
    kick_reply = asyncio.ensure_future(settling.settled("t", "c"))
    await eventually(lambda: router.got, 5, "the will on its way to the router")
    assert [(m.topic, m.delay_s) for m in router.got] == [("status/c", 30)]
    early = await holds_within_async(lambda: released or kick_reply.done(), 0.5)
    assert not early, "let go before the router held the will"
    router.go.set()
    await asyncio.wait_for(asyncio.gather(release, kick_reply), 5)
    assert released == ["c"]


async def test_a_router_that_never_answers_delays_the_release_only_by_the_bound() -> None:
    router = _HeldRouter()
    settling = SettlingConnections(settle_s=0.3)
    will = _ended_with_a_delayed_will(_wills(router))
    assert will is not None
    settling.hold_will(("t", "c"), will)
    released: list[str] = []
    await asyncio.wait_for(
        settling.release_when_settled(("t", "c"), None, None, lambda: released.append("c")), 5
    )
    await asyncio.wait_for(settling.settled("t", "c"), 5)
    assert released == ["c"]
    assert not will.done()  # still trying: the router may take it later
    will.cancel()
