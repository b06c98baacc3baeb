"""Services publishing into the mesh (services/common/bus/publisher.py) against a real
nats-server and a scripted router: what must be kept goes through the router first, live
messages share one NATS message per subject, a message the router did not keep never goes
live (raised, or handed to the `not_kept` hook), and the `$SYS` publisher sends a value the
router did not keep again next round."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus.client import connect
from services.common.bus.flushing import flushed
from services.common.bus.ids import MessageIds
from services.common.bus.publisher import NotKeptError, ServicePublisher
from services.common.message import Message
from services.common.route_table import RouteResult
from services.common.topics import topic_to_subject
from services.metrics.core import ClusterStats, TenantCounts
from services.metrics.sys_publisher import SysPublisher
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage
from tests.poll import eventually, holds_within_async

TENANT = "busp"


class ScriptedRouter:
    """Answers `route` with the scripted results (STORED once the script is used up), or
    raises while `down`; records what it was asked to keep."""

    def __init__(self, results: Sequence[RouteResult] = ()) -> None:
        self.results = list(results)
        self.down = False
        self.asked: list[str] = []

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        if self.down:
            raise ConnectionError("router down")
        self.asked += [m.topic for m in messages]
        out = self.results[: len(messages)]
        del self.results[: len(messages)]
        return out + [RouteResult.STORED] * (len(messages) - len(out))


class Listener:
    """Every NATS message on the tenant's subjects, as (subject, topics in its batch)."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.got: list[tuple[str, list[str]]] = []

    async def start(self) -> None:
        async def on(msg: Msg) -> None:
            batch = RoutedBatch.FromString(msg.data)
            self.got.append((msg.subject, [m.topic for m in batch.messages]))

        for prefix in ("mq", "mqd"):
            await self.nc.subscribe(f"{prefix}.{TENANT}.>", cb=on)
        await flushed(self.nc)

    async def settle(self, publisher_nc: Client) -> None:
        """Everything `publisher_nc` sent before now has arrived: a marker sent after it on
        the same connection came through (NATS keeps one connection's order)."""
        marker = topic_to_subject(TENANT, "marker")

        def arrived() -> bool:
            return any(s == marker for s, _ in self.got)

        async def marker_through() -> bool:
            # Sent again each second: one marker lost (a connection that reconnected under a
            # loaded suite) must not fail the test; any marker still comes after what was sent.
            await publisher_nc.publish(marker, RoutedBatch().SerializeToString())
            await flushed(publisher_nc)
            return await holds_within_async(arrived, 1.0, every_s=0.01)

        await eventually(marker_through, 15, "the marker", every_s=0)
        self.got = [g for g in self.got if g[0] != marker]


def _msg(topic: str, qos: int = 0, retain: bool = False) -> Message:
    return Message(TENANT, topic, b"v", qos, retain, published_at=time.time())


@pytest.fixture
async def buses(nats_url: str):  # type: ignore[no-untyped-def]
    pub = await connect(nats_url, "test-bus-publisher")
    sub = await connect(nats_url, "test-bus-listener")
    listener = Listener(sub)
    await listener.start()
    yield pub, listener
    await pub.close()
    await sub.close()


async def test_kept_first_then_one_nats_message_per_subject(buses) -> None:  # type: ignore[no-untyped-def]
    pub, listener = buses
    router = ScriptedRouter()
    publisher = ServicePublisher(pub, router, "rules-0")
    await publisher.publish(
        [
            _msg("a"),
            _msg("b", qos=1),
            _msg("a", retain=True),
            _msg("a"),
            _msg("$SYS/x", retain=True),
        ]
    )
    await listener.settle(pub)
    assert router.asked == ["b", "a", "$SYS/x"]  # QoS 0 without retain skips the router
    assert sorted(listener.got) == sorted(
        [
            (topic_to_subject(TENANT, "a"), ["a", "a", "a"]),
            (topic_to_subject(TENANT, "b"), ["b"]),
            (topic_to_subject(TENANT, "$SYS/x"), ["$SYS/x"]),
        ]
    )


async def test_not_kept_without_a_hook_raises_and_nothing_goes_live(buses) -> None:  # type: ignore[no-untyped-def]
    pub, listener = buses
    router = ScriptedRouter([RouteResult.STORED, RouteResult.TRY_LATER])
    publisher = ServicePublisher(pub, router, "rules-0")
    with pytest.raises(NotKeptError, match="TRY_LATER"):
        await publisher.publish([_msg("a", qos=1), _msg("b", qos=1), _msg("c")])
    router.down = True
    with pytest.raises(ConnectionError):
        await publisher.publish([_msg("d", qos=1), _msg("e")])
    await listener.settle(pub)
    assert listener.got == []


async def test_the_hook_gets_what_was_not_kept_and_the_rest_goes_live(buses) -> None:  # type: ignore[no-untyped-def]
    pub, listener = buses
    refused: list[str] = []
    router = ScriptedRouter([RouteResult.QUOTA_EXCEEDED, RouteResult.NO_MATCH])
    publisher = ServicePublisher(pub, router, "m-0", not_kept=lambda e: refused.append(e.topic))
    await publisher.publish([_msg("a", retain=True), _msg("b", retain=True)])
    await listener.settle(pub)
    assert refused == ["a"]
    assert listener.got == [(topic_to_subject(TENANT, "b"), ["b"])]

    router.down = True  # every message to keep goes to the hook; QoS 0 still goes live
    listener.got.clear()
    await publisher.publish([_msg("c", retain=True), _msg("d")])
    await listener.settle(pub)
    assert refused == ["a", "c"]
    assert listener.got == [(topic_to_subject(TENANT, "d"), ["d"])]


async def test_sys_publishes_a_value_the_router_did_not_keep_again_next_round(buses) -> None:  # type: ignore[no-untyped-def]
    pub, listener = buses
    stats = ClusterStats(stale_s=60)
    stats.report("node-0", time.monotonic(), {TENANT: TenantCounts(connections=2)})
    router = ScriptedRouter()
    sys = SysPublisher(stats, router, pub, "metrics-0", operator_tenant="")  # type: ignore[arg-type]
    connected = "$SYS/broker/clients/connected"
    maximum = "$SYS/broker/clients/maximum"  # sent when it grows, and when it was not kept
    router.down = True
    assert await sys.publish_once() > 0
    await listener.settle(pub)
    assert listener.got == []  # nothing kept: nothing live either
    router.down = False
    await sys.publish_once()  # the same figures: sent again, since none was kept
    await listener.settle(pub)
    assert (topic_to_subject(TENANT, connected), [connected]) in listener.got
    assert connected in router.asked and maximum in router.asked

    listener.got.clear()
    router.asked.clear()
    await sys.publish_once()  # kept now and unchanged: not sent again
    assert connected not in router.asked


def test_message_ids_never_repeat_across_restarts_of_a_node() -> None:
    first = MessageIds("node-0", 1_000)
    second = MessageIds("node-0", 2_000)  # the same node id, started again
    ids = [first.next() for _ in range(3)] + [second.next() for _ in range(3)]
    assert len(set(ids)) == 6
    assert MessageIds("node-1", 1_000).next() not in ids
