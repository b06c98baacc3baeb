"""Publish/subscribe through a two-node mesh with real paho-mqtt clients (v3.1.1 and v5)."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from services.common.mqtt import ConnAck, Connect, Disconnect, SubAck, Subscribe, Subscription, Will
from services.common.mqtt.properties import Properties
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho, Raw
from tests.poll import holds_within, wait_until

VERSIONS = [pytest.param(True, id="v5"), pytest.param(False, id="v311")]


@pytest.mark.parametrize("v5", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pubsub_across_nodes(mesh: MeshInfo, v5: bool, qos: int) -> None:
    sub = Paho(mesh.node(1), v5=v5)
    sub.connect()
    assert [int(rc.value) for rc in sub.subscribe(f"x/{qos}/{v5}", qos)] == [qos]
    pub = Paho(mesh.node(0), v5=v5)
    pub.connect()
    for i in range(5):
        pub.publish(f"x/{qos}/{v5}", f"m{i}", qos)
    got = sub.expect(5)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # MQTT 4.6 order
    assert {m.qos for m in got} == {qos}
    sub.close()
    pub.close()


def test_delivered_qos_is_the_minimum(mesh: MeshInfo) -> None:
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe("minq/low", 0)
    sub.subscribe("minq/high", 2)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish("minq/low", "a", 2)
    pub.publish("minq/high", "b", 1)
    got = {m.topic: m.qos for m in sub.expect(2)}
    assert got == {"minq/low": 0, "minq/high": 1}
    sub.close()
    pub.close()


def test_wildcards_and_dollar_topics(mesh: MeshInfo) -> None:
    sub = Paho(mesh.node(0))
    sub.connect()
    sub.subscribe("w/+/temp", 1)
    sub.subscribe("w/deep/#", 1)
    dollar = Paho(mesh.node(1))
    dollar.connect()
    dollar.subscribe("#", 0)  # [MQTT-4.7.2-1] '#' must not see $ topics
    pub = Paho(mesh.node(1))
    pub.connect()
    pub.publish("w/kitchen/temp", "21", 1)
    pub.publish("w/kitchen/humidity", "40", 1)
    pub.publish("w/deep", "parent", 1)  # '#' matches the parent level too
    pub.publish("w/deep/a/b", "child", 1)
    pub.publish("$internal/x", "hidden", 1)
    got = sorted((m.topic, m.payload) for m in sub.expect(3))
    assert got == [("w/deep", b"parent"), ("w/deep/a/b", b"child"), ("w/kitchen/temp", b"21")]
    sub.nothing()
    # Other tests share the tenant: look only at this test's topics.
    mine = ("w/", "$internal/")
    seen: set[str] = set()
    while len(seen & {"w/kitchen/temp", "w/kitchen/humidity", "w/deep", "w/deep/a/b"}) < 4:
        seen |= {m.topic for m in dollar.expect(1) if m.topic.startswith(mine)}

    def internal_seen() -> bool:
        while not dollar.messages.empty():
            seen.add(dollar.messages.get().topic)
        return "$internal/x" in seen

    # Must not happen: $internal/x would reach the `#` subscriber within this window.
    assert not holds_within(internal_seen, 0.4), seen
    for c in (sub, dollar, pub):
        c.close()


def test_overlapping_subscriptions_deliver_once(mesh: MeshInfo) -> None:
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe("ov/#", 0, sub_id=1)
    sub.subscribe("ov/+", 1, sub_id=2)
    sub.subscribe("ov/a", 2, sub_id=3)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish("ov/a", "once", 2)
    (m,) = sub.expect(1)
    assert m.payload == b"once" and m.qos == 2  # highest of the matching subscriptions
    assert sorted(m.properties.SubscriptionIdentifier) == [1, 2, 3]
    sub.nothing()
    sub.close()
    pub.close()


def test_no_local(mesh: MeshInfo) -> None:
    c = Paho(mesh.node(0))
    c.connect()
    c.subscribe("nl/t", 1, noLocal=True)
    other = Paho(mesh.node(1))
    other.connect()
    c.publish("nl/t", "mine", 1)
    other.publish("nl/t", "theirs", 1)
    (m,) = c.expect(1)
    assert m.payload == b"theirs"
    c.nothing()
    c.close()
    other.close()


def test_will_on_abrupt_close_not_on_clean_disconnect(mesh: MeshInfo) -> None:
    watcher = Paho(mesh.node(1))
    watcher.connect()
    watcher.subscribe("will/+", 1)
    raw = Raw(mesh.node(0))
    ack = raw.connect(Connect("will-raw", 5, will=Will("will/raw", b"gone", 1)))
    assert ack.reason_code == 0  # type: ignore[union-attr]
    raw.sock.shutdown(socket.SHUT_RDWR)
    raw.close()
    (m,) = watcher.expect(1)
    assert (m.topic, m.payload) == ("will/raw", b"gone")

    clean = Paho(mesh.node(0), will=("will/clean", b"should-not-arrive", 1))
    clean.connect()
    clean.close()
    watcher.nothing(0.8)
    watcher.close()


def test_a_will_on_a_sys_topic_is_never_published(mesh: MeshInfo) -> None:
    """`$SYS` is the server's: no client may publish there, by a PUBLISH (refused) or as its
    will (dropped, as a will the ACL refuses), or it could plant retained `$SYS` figures."""
    tag = uuid.uuid4().hex[:6]
    watcher = Paho(mesh.node(1))
    watcher.connect()
    watcher.subscribe(f"$SYS/{tag}/#", 1)
    watcher.subscribe(f"ok/{tag}", 1)
    for node, level, retain in ((0, 5, True), (1, 4, False)):
        raw = Raw(mesh.node(node), level=level)
        will = Will(f"$SYS/{tag}/broker/uptime", b"forged", 1, retain)
        ack = raw.connect(Connect(f"sys-will-{tag}-{level}", level, will=will))
        assert ack.reason_code == 0  # type: ignore[union-attr]
        raw.sock.shutdown(socket.SHUT_RDWR)
        raw.close()
    raw = Raw(mesh.node(0))  # a will elsewhere still goes out, after them
    raw.connect(Connect(f"ok-will-{tag}", 5, will=Will(f"ok/{tag}", b"gone", 1)))
    raw.sock.shutdown(socket.SHUT_RDWR)
    raw.close()
    (m,) = watcher.expect(1)
    assert m.topic == f"ok/{tag}"
    watcher.nothing(0.8)
    watcher.close()
    late = Paho(mesh.node(0))  # and nothing was retained
    late.connect()
    late.subscribe(f"$SYS/{tag}/#", 1)
    late.nothing(0.8)
    late.close()


@pytest.mark.parametrize("v5", VERSIONS)
def test_a_persistent_connect_right_after_a_clean_one_finds_no_session(
    mesh: MeshInfo, v5: bool
) -> None:
    """[MQTT-3.1.2-6] / [MQTT-3.2.2-2]: a clean connection ended the client id's session, so
    a persistent CONNECT right after it gets Session Present 0, even on another node and
    before the old session's subscriptions and queue are deleted."""
    cid = f"sp-{uuid.uuid4().hex[:6]}"
    level = 5 if v5 else 4
    expiry = Properties(session_expiry_interval=300) if v5 else Properties()
    for _ in range(3):
        first = Raw(mesh.node(0), level=level)
        ack = first.connect(Connect(cid, level, clean_start=False, properties=expiry))
        assert isinstance(ack, ConnAck)
        first.send(Subscribe(1, (Subscription(f"sp/{cid}", 1),)))
        assert isinstance(first.recv(), SubAck)
        first.send(Disconnect())
        first.close()
        clean = Raw(mesh.node(1), level=level)
        ack = clean.connect(Connect(cid, level, clean_start=True))
        assert isinstance(ack, ConnAck) and not ack.session_present
        clean.send(Disconnect())
        clean.close()
        again = Raw(mesh.node(0), level=level)
        ack = again.connect(Connect(cid, level, clean_start=False, properties=expiry))
        assert isinstance(ack, ConnAck) and not ack.session_present, ack
        again.send(Disconnect())
        again.close()
        cleanup = Raw(mesh.node(0), level=level)  # ends this session for the next round
        cleanup.connect(Connect(cid, level, clean_start=True))
        cleanup.send(Disconnect())
        cleanup.close()


def test_a_client_that_cannot_take_the_connack_leaves_nothing_behind(mesh: MeshInfo) -> None:
    """[MQTT-3.1.2-24] A Maximum Packet Size below the CONNACK's size: no CONNACK, the socket
    closes, and the connection the session service had accepted is released (no registry
    entry left holding a connection slot, and no will)."""
    import asyncio

    from services.session.client import SessionAdminClient
    from tests.conftest import ADMIN_TOKEN

    cid = f"tiny-{uuid.uuid4().hex[:6]}"
    watcher = Paho(mesh.node(1))
    watcher.connect()
    watcher.subscribe(f"tiny/{cid}", 1)
    raw = Raw(mesh.node(0))
    raw.send(
        Connect(
            cid,
            5,
            will=Will(f"tiny/{cid}", b"gone", 1),
            properties=Properties(maximum_packet_size=8),
        )
    )
    assert raw.closed() and not raw.pending
    raw.close()

    async def held() -> bool:
        admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            return any(c.client_id == cid for c in await admin.list_clients("default"))
        finally:
            await admin.close()

    wait_until(lambda: not asyncio.run(held()), 10, "the registry entry removed", 0.1)
    watcher.nothing(0.8)
    watcher.close()


@pytest.mark.parametrize("v5", VERSIONS)
def test_takeover_across_nodes(mesh: MeshInfo, v5: bool) -> None:
    first = Paho(mesh.node(0), client_id=f"dup-{v5}", v5=v5)
    first.connect()
    second = Paho(mesh.node(1), client_id=f"dup-{v5}", v5=v5)
    second.connect()
    rc = first.disconnects.get(timeout=10)
    if v5:
        assert int(rc.value) == 0x8E  # session taken over
    # The survivor works.
    second.subscribe(f"tk/{v5}", 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish(f"tk/{v5}", "hi", 1)
    assert second.expect(1)[0].payload == b"hi"
    first.c.loop_stop()
    second.close()
    pub.close()


def test_racing_connects_leave_exactly_one(mesh: MeshInfo) -> None:
    import threading

    raws = [Raw(mesh.node(i % 2)) for i in range(6)]
    barrier = threading.Barrier(len(raws))

    def go(r: Raw) -> None:
        barrier.wait()
        r.send(Connect("racer", 5))

    threads = [threading.Thread(target=go, args=(r,)) for r in raws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = [r for r in raws if not r.closed(timeout=3)]
    assert len(alive) == 1
    for r in raws:
        r.close()


def test_will_delay_is_honoured_and_cancelled_by_a_reconnect(mesh: MeshInfo) -> None:
    """[MQTT-3.1.3-9] A delayed will waits; a new connection to the session before the
    delay cancels it; without one it is published after the delay."""
    watcher = Paho(mesh.node(1))
    watcher.connect()
    watcher.subscribe("wd/+", 1)
    persistent = Properties(session_expiry_interval=60)

    def drop(cid: str, topic: str) -> None:
        raw = Raw(mesh.node(0))
        raw.connect(
            Connect(
                cid,
                5,
                clean_start=False,
                properties=persistent,
                will=Will(topic, b"gone", 1, False, Properties(will_delay_interval=2)),
            )
        )
        raw.sock.shutdown(socket.SHUT_RDWR)
        raw.close()

    cid = f"wd-{uuid.uuid4().hex[:6]}"
    drop(cid, "wd/late")
    started = time.monotonic()
    watcher.nothing(1.2)  # not before its delay
    (m,) = watcher.expect(1, timeout=4)
    assert m.topic == "wd/late" and time.monotonic() - started >= 1.8

    cid2 = f"wd-{uuid.uuid4().hex[:6]}"
    drop(cid2, "wd/cancelled")
    back = Raw(mesh.node(1))  # the session comes back before the delay: no will
    back.connect(Connect(cid2, 5, clean_start=False, properties=persistent))
    watcher.nothing(3.0)
    back.close()
    watcher.close()


def test_a_clean_start_publishes_the_delayed_will_at_once(mesh: MeshInfo) -> None:
    """[MQTT-3.1.3-9] A new connection that ends the session (Clean Start) does not wait for
    the will's delay: the will of the session it ended is published now."""
    watcher = Paho(mesh.node(1))
    watcher.connect()
    watcher.subscribe("wn/+", 1)
    cid = f"wn-{uuid.uuid4().hex[:6]}"
    raw = Raw(mesh.node(0))
    raw.connect(
        Connect(
            cid,
            5,
            clean_start=False,
            properties=Properties(session_expiry_interval=600),
            will=Will("wn/now", b"gone", 1, False, Properties(will_delay_interval=300)),
        )
    )
    raw.sock.shutdown(socket.SHUT_RDWR)
    raw.close()
    watcher.nothing(0.5)  # delayed, not published at the drop
    back = Raw(mesh.node(1))
    back.connect(Connect(cid, 5, clean_start=True))
    (m,) = watcher.expect(1, timeout=10)  # not after 300 s
    assert m.topic == "wn/now" and m.payload == b"gone"
    back.close()
    watcher.close()
