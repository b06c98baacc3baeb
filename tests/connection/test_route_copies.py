"""A node's copies of persistent route tables (services/connection/replica.py) against the
real router and queue services in this process: a copy routes publishes straight to the
queues, a copy that missed a change is refused by the queue and the publish still reaches
exactly the sessions the router's table says, and changes reach the copy as events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
import pytest
from nats.aio.client import Client

from services.common.bus.unary import DIRECT_APPEND_SUBJECT, UnaryClient
from services.common.mqtt.packets import Subscription
from services.common.rpc.errors import InvalidArgumentError
from services.connection.replica import CopyRouter, RouteCopies
from services.queue.client import QueueClient, StaleRoutesError, queue_id
from services.router.client import RouterClient, RouteResult
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from starling.queue.v1.queue_pb2 import AppendRequest
from tests.inproc import Core
from tests.poll import eventually


@dataclass
class Parts:
    router: RouterClient
    queues: QueueClient
    nc: Client


@pytest.fixture
async def parts(core: Core, nats_url: str) -> AsyncIterator[Parts]:
    nc = await nats.connect(nats_url)
    router, queues = RouterClient(core.router), QueueClient(core.queue)
    router.use_bus(nc)
    queues.use_bus(nc)
    yield Parts(router, queues, nc)
    for c in (router, queues):
        await c.close()
    await nc.close()


def tenant() -> str:
    return f"cp{uuid.uuid4().hex[:6]}"


def msg(tenant: str, topic: str, retain: bool = False) -> RoutedMessage:
    return RoutedMessage(
        tenant=tenant,
        topic=topic,
        payload=b"x",
        qos=1,
        retain=retain,
        publisher=Publisher(client_id="pub", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=uuid.uuid4().hex,
    )


async def loaded(copies: RouteCopies, t: str) -> None:
    await eventually(lambda: copies.get(t) is not None, 10, f"copy of {t} loaded")


async def topics_in(parts: Parts, t: str, client: str) -> list[str]:
    read = await parts.queues.read(t, queue_id(client, 1), 1, 100)
    return [e.message.topic for e in read.entries]


async def test_a_copy_that_missed_a_subscription_is_refused_and_the_router_routes(
    parts: Parts,
) -> None:
    """The copy never hears of changes (no event subscription): after a subscription the
    router acknowledged, a publish chosen from the old copy must still reach it."""
    t = tenant()
    await parts.router.subscribe(t, "old", 1, [(Subscription("a/#", 1), None)])
    copies = RouteCopies(parts.router, parts.nc, 1000)  # not started: no change events
    route = CopyRouter(parts.router, parts.queues, copies)
    await loaded(copies, t)
    assert await route.route([msg(t, "a/1")]) == [RouteResult.STORED]

    await parts.router.subscribe(t, "new", 1, [(Subscription("a/+", 1), None)])
    assert await route.route([msg(t, "a/2"), msg(t, "b/1")]) == [
        RouteResult.STORED,
        RouteResult.NO_MATCH,
    ]
    assert await topics_in(parts, t, "new") == ["a/2"]
    assert await topics_in(parts, t, "old") == ["a/1", "a/2"]
    # The refusal dropped the copy; the next publish loads the current table again.
    await loaded(copies, t)
    assert copies.loads == 2
    assert await route.route([msg(t, "a/3")]) == [RouteResult.STORED]
    assert await topics_in(parts, t, "new") == ["a/2", "a/3"]


async def test_a_copy_that_missed_an_unsubscribe_never_appends_to_the_old_queue(
    parts: Parts,
) -> None:
    t = tenant()
    await parts.router.subscribe(t, "c", 1, [(Subscription("u/#", 1), None)])
    copies = RouteCopies(parts.router, parts.nc, 1000)
    route = CopyRouter(parts.router, parts.queues, copies)
    await loaded(copies, t)
    await parts.router.unsubscribe(t, "c", 1, ["u/#"])
    assert await route.route([msg(t, "u/1")]) == [RouteResult.NO_MATCH]
    await parts.router.subscribe(t, "d", 1, [(Subscription("u/#", 1), None)])
    await loaded(copies, t)
    await parts.router.drop_session(t, "d", 1)
    assert await route.route([msg(t, "u/2")]) == [RouteResult.NO_MATCH]
    assert await topics_in(parts, t, "c") == []
    assert await topics_in(parts, t, "d") == []


async def test_changes_reach_a_started_copy_without_reloading(parts: Parts) -> None:
    t = tenant()
    copies = RouteCopies(parts.router, parts.nc, 1000)
    await copies.start()
    try:
        route = CopyRouter(parts.router, parts.queues, copies)
        await loaded(copies, t)  # an empty table: publishes confirmed by the queue alone
        assert await route.route([msg(t, "x/1")]) == [RouteResult.NO_MATCH]
        await parts.router.subscribe(t, "s1", 1, [(Subscription("x/+", 1), 7)])
        await parts.router.subscribe(t, "s2", 1, [(Subscription("x/#", 0), None)])
        await eventually(lambda: len(copies.get(t).table) == 2, 10, "changes applied")  # type: ignore[union-attr]
        await parts.router.unsubscribe(t, "s2", 1, ["x/#"])
        await eventually(lambda: len(copies.get(t).table) == 1, 10, "unsubscribe applied")  # type: ignore[union-attr]
        assert await route.route([msg(t, "x/2")]) == [RouteResult.STORED]
        read = await parts.queues.read(t, queue_id("s1", 1), 1, 10)
        assert [(e.message.topic, e.subscription_ids) for e in read.entries] == [("x/2", (7,))]
        assert copies.loads == 1  # followed by events, never reloaded
    finally:
        await copies.stop()


async def test_retained_and_over_budget_tenants_go_through_the_router(parts: Parts) -> None:
    t = tenant()
    await parts.router.subscribe(
        t, "r", 1, [(Subscription("r/1", 1), None), (Subscription("r/2", 1), None)]
    )
    small = RouteCopies(parts.router, parts.nc, 1)  # budget below the tenant's table
    route = CopyRouter(parts.router, parts.queues, small)
    small.get(t)
    await eventually(lambda: small.loads == 1, 10, "snapshot asked")
    assert small.get(t) is None  # too large: the router routes
    assert await route.route([msg(t, "r/1")]) == [RouteResult.STORED]
    copies = RouteCopies(parts.router, parts.nc, 1000)
    route = CopyRouter(parts.router, parts.queues, copies)
    await loaded(copies, t)
    # A retained publish goes to the router, which stores it as retained.
    assert await route.route([msg(t, "r/2", retain=True)]) == [RouteResult.STORED]
    assert [m.topic for m in await parts.router.retained(t, "r/#")] == ["r/2"]
    assert await topics_in(parts, t, "r") == ["r/1", "r/2"]


async def test_the_queue_refuses_unchecked_or_unknown_versions_from_nodes(
    parts: Parts,
) -> None:
    t = tenant()
    with pytest.raises(StaleRoutesError):  # a version the router never fenced
        await parts.queues.append(t, [], routes_checked=12345)
    req = AppendRequest(tenant=t).SerializeToString()  # no routes_checked
    with pytest.raises(InvalidArgumentError):
        await UnaryClient(parts.nc, 5).call(DIRECT_APPEND_SUBJECT, req)


async def test_a_snapshot_needs_a_tenant(parts: Parts) -> None:
    with pytest.raises(InvalidArgumentError, match="tenant is required"):
        await parts.router.route_snapshot("", 10)
