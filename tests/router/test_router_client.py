"""The router clients against the router and queue services in this process (tests/inproc.py):
routing results, persistent subscriptions, retained messages, delayed publishes
and wills, as domain values."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.common.message import Message
from services.common.mqtt.packets import Subscription
from services.common.rpc.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from services.queue.client import QueueClient, queue_id
from services.router.client import (
    DelayedMessage,
    RetainedListing,
    Route,
    RouterAdminClient,
    RouterClient,
    RouteResult,
)
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from starling.router.v1 import router_pb2
from tests.inproc import ADMIN_TOKEN, Core


@dataclass
class Mesh:
    address: str  # the router's
    router: RouterClient
    admin: RouterAdminClient
    queues: QueueClient


@pytest.fixture
async def mesh(core: Core) -> AsyncIterator[Mesh]:
    m = Mesh(
        core.router,
        RouterClient(core.router),
        RouterAdminClient(core.router, ADMIN_TOKEN),
        QueueClient(core.queue),
    )
    yield m
    for c in (m.router, m.admin, m.queues):
        await c.close()


def tenant() -> str:
    return f"rt{uuid.uuid4().hex[:6]}"


def publish(
    tenant: str, topic: str, qos: int = 1, retain: bool = False, delay_s: int = 0
) -> RoutedMessage:
    return RoutedMessage(
        tenant=tenant,
        topic=topic,
        payload=b"x",
        qos=qos,
        retain=retain,
        delay_s=delay_s,
        publisher=Publisher(client_id="pub", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=uuid.uuid4().hex,
    )


async def test_subscriptions_round_trip_and_route_to_the_queue(mesh: Mesh) -> None:
    t = tenant()
    subs = [
        (Subscription("a/+", 1, no_local=True, retain_handling=2), 5),
        (Subscription("b/#", 2, retain_as_published=True), None),
    ]
    await mesh.router.subscribe(t, "c1", 1, subs)
    assert sorted(await mesh.router.subscriptions(t, "c1", 1), key=lambda s: s[0].filter) == subs
    assert await mesh.router.route([publish(t, "a/1"), publish(t, "zzz")]) == [
        RouteResult.STORED,
        RouteResult.NO_MATCH,
    ]
    read = await mesh.queues.read(t, queue_id("c1", 1), 1, 10)
    assert [(e.message.topic, e.message.qos, e.subscription_ids) for e in read.entries] == [
        ("a/1", 1, (5,))
    ]
    routes = await mesh.admin.list_routes(t)
    assert Route("b/#", ("c1#1",), True) in routes and Route("a/+", ("c1#1",), True) in routes

    await mesh.router.unsubscribe(t, "c1", 1, ["a/+"])
    assert [s.filter for s, _ in await mesh.router.subscriptions(t, "c1", 1)] == ["b/#"]
    await mesh.router.drop_session(t, "c1", 1)
    assert await mesh.router.subscriptions(t, "c1", 1) == []
    assert await mesh.router.route([publish(t, "b/1")]) == [RouteResult.NO_MATCH]


async def test_retained_messages_returned_or_queued(mesh: Mesh) -> None:
    t = tenant()
    assert await mesh.router.route([publish(t, "r/1", qos=2, retain=True)]) == [
        RouteResult.NO_MATCH
    ]
    (found,) = await mesh.router.retained(t, "r/#")
    assert isinstance(found, Message)
    assert (found.tenant, found.topic, found.payload, found.qos, found.retain) == (
        t,
        "r/1",
        b"x",
        2,
        True,
    )
    assert found.publisher == "pub"

    qid = queue_id("c2", 3)
    await mesh.router.queue_retained(t, "r/+", qid, 1, 9)
    await mesh.router.queue_retained(t, "r/1", qid, 2, None)
    read = await mesh.queues.read(t, qid, 1, 10)
    assert [(e.message.qos, e.message.retain, e.subscription_ids) for e in read.entries] == [
        (1, True, (9,)),
        (2, True, ()),
    ]

    listing = await mesh.admin.list_retained(t, "#", 10)
    assert isinstance(listing, RetainedListing)
    assert ([m.topic for m in listing.messages], listing.stored) == (["r/1"], 1)
    assert await mesh.admin.delete_retained(t, "r/1") is True
    assert await mesh.admin.delete_retained(t, "r/1") is False
    assert await mesh.router.retained(t, "r/#") == []


async def test_delayed_publishes_and_wills(mesh: Mesh) -> None:
    t = tenant()
    assert await mesh.router.route(
        [publish(t, "$delayed/60/later"), publish(t, "will/w", delay_s=30)]
    ) == [RouteResult.STORED, RouteResult.STORED]
    delayed = await mesh.admin.list_delayed(t)
    assert all(isinstance(d, DelayedMessage) for d in delayed)
    assert sorted(d.message.topic for d in delayed) == ["later", "will/w"]
    will = next(d for d in delayed if d.message.topic == "will/w")
    assert will.id == "will/pub" and will.due_ms > time.time() * 1000

    assert await mesh.router.settle_will(t, "pub", publish_now=False) is True
    assert await mesh.router.settle_will(t, "pub", publish_now=False) is False
    (later,) = await mesh.admin.list_delayed(t)
    await mesh.admin.cancel_delayed(t, later.id)
    assert await mesh.admin.list_delayed(t) == []
    with pytest.raises(NotFoundError, match=later.id):
        await mesh.admin.cancel_delayed(t, later.id)


async def test_bad_requests_and_tokens_raise(mesh: Mesh) -> None:
    bad = publish("t", "a")
    bad.message_id = ""
    with pytest.raises(InvalidArgumentError, match="message_id"):
        await mesh.router.route([bad])
    with pytest.raises(InvalidArgumentError, match="incarnation"):
        await mesh.router.subscribe("t", "c", 0, [(Subscription("a"), None)])
    with pytest.raises(InvalidArgumentError, match="tenant"):
        await mesh.admin.list_routes("")
    wrong = RouterAdminClient(mesh.address, "wrong")
    with pytest.raises(PermissionDeniedError):
        await wrong.list_delayed("t")
    await wrong.close()


def test_route_results_are_the_proto_values() -> None:
    assert {r.name: int(r) for r in RouteResult} == {
        router_pb2.RouteResult.Name(v).removeprefix("ROUTE_RESULT_"): v
        for v in router_pb2.RouteResult.values()
        if v != router_pb2.ROUTE_RESULT_UNSPECIFIED
    }
