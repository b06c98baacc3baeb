"""Wills kept for a node's death (services/session/wills.py): what the registry keeps of a
CONNECT's will (only what its connection may publish, within the size bound on both sides),
when a displaced connection's will is due, and a will the router refused tried again and
published live once."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from services.common.acl import Access, AclRule
from services.common.bus.ids import MessageIds
from services.common.bus.publisher import ServicePublisher
from services.common.mqtt.packets import Will
from services.common.mqtt.properties import Properties
from services.common.route_table import RouteResult
from services.common.tasks import TaskSet
from services.connection.wills import Wills
from services.session.registry import Holder, _decode, _encode
from services.session.wills import StoredWills, displaced_will_due, kept_will
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage
from tests.conftest import NATS_PASSWORD, NATS_USER
from tests.poll import eventually, holds_within_async

if TYPE_CHECKING:
    from nats.js import JetStreamContext


def _node_wills(max_bytes: int = 1 << 20) -> Wills:
    """A node's wills as far as handing one over goes (nothing published, nothing routed)."""
    return Wills(
        node_id="node-a",
        publish=lambda msgs: None,
        router=None,
        tasks=TaskSet(),
        ids=MessageIds("node-a", 1),
        handoff_max_bytes=max_bytes,
    )


def _envelope(topic: str, payload: bytes = b"bye") -> bytes:
    will = Will(topic, payload, 1, True, Properties(message_expiry_interval=30))
    return _node_wills().handoff(will, "dev-1")


def test_a_will_the_acl_allows_is_kept_whole() -> None:
    kept = kept_will(_envelope("status/dev-1"), [], True, 1024)
    env = RoutedMessage.FromString(base64.b64decode(kept))
    assert (env.topic, env.payload, env.qos, env.retain) == ("status/dev-1", b"bye", 1, True)
    assert env.publisher.client_id == "dev-1"
    assert env.properties.message_expiry_interval_s == 30  # counted from its publication


def test_a_will_the_acl_refuses_or_too_large_is_not_kept() -> None:
    deny = [AclRule(False, Access.PUBLISH, "secret/#")]
    assert kept_will(_envelope("secret/x"), deny, True, 1024) == ""
    assert kept_will(_envelope("status/x"), [], False, 1024) == ""  # default deny
    assert kept_will(_envelope("$SYS/broker/uptime"), [], True, 1024) == ""  # the server's
    allow = [AclRule(True, Access.PUBLISH, "status/+")]
    assert kept_will(_envelope("status/x"), allow, False, 1024) != ""
    big = _envelope("status/x", b"x" * 2000)
    assert kept_will(big, [], True, 1024) == ""
    assert kept_will(big, [], True, len(big)) != ""
    assert kept_will(b"", [], True, 1024) == ""
    assert kept_will(b"\xff\xfe not an envelope", [], True, 1024) == ""


def test_the_registry_entry_carries_the_will_and_omits_it_when_there_is_none() -> None:
    with_will = Holder("t", "c", "node-a", 7, will="d2lsbA==", will_delay_s=5)
    assert _decode(_encode(with_will)) == with_will
    plain = Holder("t", "c", "node-a", 7)
    assert "will" not in json.loads(_encode(plain))
    assert _decode(_encode(plain)) == plain


def test_a_displaced_will_is_due_unless_its_client_is_back_within_the_delay() -> None:
    def holder(delay: int) -> Holder:
        return Holder("t", "c", "node-a", 7, will="d2lsbA==", will_delay_s=delay)

    assert displaced_will_due(holder(0), clean_start=False, silent_s=0.1)
    assert displaced_will_due(holder(30), clean_start=True, silent_s=0.1)  # session ends
    assert not displaced_will_due(holder(30), clean_start=False, silent_s=0.1)
    assert displaced_will_due(holder(5), clean_start=False, silent_s=7.0)  # back too late


def test_a_node_hands_over_no_will_larger_than_its_bound() -> None:
    wills = _node_wills  # with the bound given
    small, big = Will("s/1", b"x" * 10), Will("s/1", b"x" * 5000)
    assert RoutedMessage.FromString(wills(1024).handoff(small, "c")).payload == b"x" * 10
    assert wills(1024).handoff(big, "c") == b""
    assert wills(0).handoff(small, "c") == b""  # will_store_max_bytes 0: none
    assert wills(1024).handoff(None, "c") == b""


class _Router:
    """The router's answers as a session service sees them: the first call refuses the QoS 1
    will (a subscriber's queue is full, or the router is away), the next takes it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        self.calls.append([m.topic for m in messages])
        if len(self.calls) == 1:
            return [RouteResult.QUEUE_QUOTA_EXCEEDED for _ in messages]
        return [RouteResult.STORED for _ in messages]


async def _watching(nats_url: str) -> tuple[Any, str, list[str]]:
    """A NATS connection, a fresh tenant, and the topics that go live in it (as they come)."""
    import nats

    nc = await nats.connect(nats_url, user=NATS_USER, password=NATS_PASSWORD)
    live: list[str] = []

    async def seen(msg: Any) -> None:
        live.extend(m.topic for m in RoutedBatch.FromString(msg.data).messages)

    tenant = f"w{uuid.uuid4().hex[:6]}"
    await nc.subscribe(f"mq.{tenant}.>", cb=seen)
    return nc, tenant, live


async def test_a_will_the_router_refused_is_tried_again_and_goes_live_once(
    nats_url: str,
) -> None:
    nc, tenant, live = await _watching(nats_url)
    router = _Router()
    stored = StoredWills(ServicePublisher(nc, router, "session-test"))
    node = _node_wills()

    def holder(name: str, qos: int) -> Holder:
        env = node.handoff(Will(f"s/{name}", b"gone", qos), name)
        return Holder(tenant, name, "node-a", 1, will=base64.b64encode(env).decode())

    try:
        await stored.publish([holder("a", 1), holder("b", 0)], int(time.time() * 1000))
        await eventually(
            lambda: len(router.calls) >= 2 and len(live) >= 2, 5, lambda: f"{router.calls} {live}"
        )
        # Must not happen: a third router call or live will in a short window.
        assert not await holds_within_async(lambda: len(router.calls) > 2 or len(live) > 2, 0.2)
        assert router.calls == [["s/a"], ["s/a"]]  # QoS 0 needs no router
        assert sorted(live) == ["s/a", "s/b"]  # each once; "a" only once the router took it
    finally:
        await stored.settle(1.0)
        await nc.close()


class _Kept:
    """A router that keeps everything (STORED)."""

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        return [RouteResult.STORED for _ in messages]


async def _add_rules_stream(js: JetStreamContext) -> None:
    """The RULES stream as the rules service creates it (its default limits)."""
    from services.rules.config import RulesSettings
    from services.rules.consumer import rules_stream_config

    defaults = RulesSettings.model_fields
    await js.add_stream(
        rules_stream_config(
            defaults["rules_stream_max_age_s"].default, defaults["rules_stream_max_bytes"].default
        )
    )


async def _in_rules_stream(js: JetStreamContext, tenant: str) -> list[tuple[str, int]]:
    """The tenant's messages in the RULES stream, read by sequence (no consumer: the stream
    is a work queue, whose rl.> the rules service's consumer may hold)."""
    from nats.js.errors import NotFoundError

    out, seq = [], 1
    while True:
        try:
            raw = await js.get_msg("RULES", seq, subject=f"rl.{tenant}", next=True)
        except NotFoundError:
            return out
        env = RoutedMessage.FromString(raw.data or b"")
        out.append((env.topic, env.qos))
        seq = (raw.seq or seq) + 1


async def test_wills_a_rule_reads_reach_the_rules_stream(nats_url: str) -> None:
    """The RULES stream gets each will a rule of its tenant reads, as a node's publish would
    reach it: QoS 1 stored before the will counts as kept, QoS 0 offered; none other."""
    import nats

    from services.rules.client import RuleFeed

    nc = await nats.connect(nats_url, user=NATS_USER, password=NATS_PASSWORD)
    js = nc.jetstream()
    await _add_rules_stream(js)
    tenant = f"w{uuid.uuid4().hex[:6]}"
    feed = RuleFeed(nc)
    feed.set_filters(tenant, ["s/#"])
    stored = StoredWills(ServicePublisher(nc, _Kept(), "session-test", rules=feed))
    node = _node_wills()

    def holder(topic: str, qos: int) -> Holder:
        env = node.handoff(Will(topic, b"gone", qos), topic)
        return Holder(tenant, topic, "node-a", 1, will=base64.b64encode(env).decode())

    try:
        await stored.publish(
            [holder("s/a", 1), holder("s/b", 0), holder("x/c", 1)], int(time.time() * 1000)
        )

        async def in_stream() -> list[tuple[str, int]]:
            return await _in_rules_stream(js, tenant)

        async def at_least(n: int) -> bool:
            return len(await in_stream()) >= n

        # The QoS 0 one is offered, not awaited.
        await eventually(lambda: at_least(2), 5, "two wills in the stream", every_s=0.05)
        # Must not happen: x/c would be there within this window.
        assert not await holds_within_async(lambda: at_least(3), 0.3, every_s=0.05)
        assert sorted(await in_stream()) == [("s/a", 1), ("s/b", 0)]
    finally:
        await stored.settle(1.0)
        await js.purge_stream("RULES", subject=f"rl.{tenant}")
        await nc.close()


class _DownStream:
    """The rules' intake as a session service sees it while JetStream is away: reads every
    topic, takes nothing."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    def wanted(self, tenant: str, topic: str) -> bool:
        return True

    async def store(self, envs: Sequence[RoutedMessage]) -> list[bool]:
        self.tried += [e.topic for e in envs]
        return [False for _ in envs]

    def offer(self, env: RoutedMessage) -> None:
        self.tried.append(env.topic)


async def test_a_will_the_rules_stream_does_not_take_still_goes_out(nats_url: str) -> None:
    """The rules are fed best effort: a will the router kept goes live, once, whether or not
    the RULES stream took it."""
    nc, tenant, live = await _watching(nats_url)
    feed = _DownStream()
    stored = StoredWills(ServicePublisher(nc, _Kept(), "session-test", rules=feed))
    node = _node_wills()
    env = node.handoff(Will("s/a", b"gone", 1), "a")
    try:
        holder = Holder(tenant, "a", "node-a", 1, will=base64.b64encode(env).decode())
        await stored.publish([holder], int(time.time() * 1000))
        await eventually(lambda: live and feed.tried, 5, lambda: f"{feed.tried} {live}")
        # Must not happen: a second live will or a second offer in a short window.
        assert not await holds_within_async(lambda: len(live) > 1 or len(feed.tried) > 1, 0.3)
        assert live == ["s/a"] and feed.tried == ["s/a"]
    finally:
        await stored.settle(1.0)
        await nc.close()
