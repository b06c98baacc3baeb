"""Retained messages and delayed publish across the two-node mesh."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps

from starling.router.v1 import router_pb2 as rpb
from starling.router.v1 import router_pb2_grpc as rgrpc
from tests.conftest import MeshInfo
from tests.e2e.admin import MD
from tests.e2e.clients import Paho
from tests.poll import wait_until


def _t() -> str:
    return f"r{uuid.uuid4().hex[:8]}"


def _router_admin(mesh: MeshInfo) -> rgrpc.RouterAdminServiceStub:
    return rgrpc.RouterAdminServiceStub(grpc.insecure_channel(mesh.addr("router")))


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "v311"])
def test_retained_set_on_one_node_seen_on_the_other(mesh: MeshInfo, v5: bool) -> None:
    base = _t()
    pub = Paho(mesh.node(0), v5=v5)
    pub.connect()
    pub.publish(f"{base}/a", "A", 1, retain=True)  # after PUBACK every node must see it
    pub.publish(f"{base}/b", "B", 1, retain=True)
    exact = Paho(mesh.node(1), v5=v5)
    exact.connect()
    exact.subscribe(f"{base}/a", 1)
    (m,) = exact.expect(1)
    assert (m.topic, m.payload, m.retain) == (f"{base}/a", b"A", True)
    wild = Paho(mesh.node(1), v5=v5)
    wild.connect()
    wild.subscribe(f"{base}/+", 1)
    assert sorted((m.topic, m.payload) for m in wild.expect(2)) == [
        (f"{base}/a", b"A"),
        (f"{base}/b", b"B"),
    ]
    # An empty payload deletes it [MQTT-3.3.1-10].
    pub.publish(f"{base}/a", b"", 1, retain=True)
    late = Paho(mesh.node(1), v5=v5)
    late.connect()
    late.subscribe(f"{base}/#", 1)
    assert [m.payload for m in late.expect(1)] == [b"B"]
    late.nothing()
    for c in (pub, exact, wild, late):
        c.close()


def test_retain_handling_and_retain_as_published(mesh: MeshInfo) -> None:
    topic = f"{_t()}/rh"
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish(topic, "kept", 1, retain=True)
    c = Paho(mesh.node(1))
    c.connect()
    c.subscribe(topic, 1, retainHandling=1)
    assert c.expect(1)[0].payload == b"kept"
    c.subscribe(topic, 1, retainHandling=1)  # existing subscription: not sent again
    c.nothing(0.6)
    never = Paho(mesh.node(1))
    never.connect()
    never.subscribe(topic, 1, retainHandling=2)
    never.nothing(0.6)
    # Retain as published: a live retained publish keeps RETAIN only with the option on.
    rap = Paho(mesh.node(1))
    rap.connect()
    rap.subscribe(topic, 1, retainHandling=2, retainAsPublished=True)
    pub.publish(topic, "live", 1, retain=True)
    assert never.expect(1)[0].retain is False  # [MQTT-3.3.1-12]
    assert rap.expect(1)[0].retain is True  # [MQTT-3.3.1-13]
    for x in (pub, c, never, rap):
        x.close()


def test_expired_retained_message_is_not_delivered(mesh: MeshInfo) -> None:
    topic = f"{_t()}/exp"
    pub = Paho(mesh.node(0))
    pub.connect()
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 1
    pub.publish(topic, "short-lived", 1, retain=True, props=props)
    time.sleep(1.6)
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe(topic, 1)
    sub.nothing(0.8)
    pub.close()
    sub.close()


def test_wildcard_subscribe_costs_what_it_matches(mesh: MeshInfo) -> None:
    base = _t()
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(10_000):
        pub.c.publish(f"{base}/plant/{i}/temp", str(i), 0, retain=True)
    for i in range(10):
        pub.publish(f"{base}/lab/{i}/temp", str(i), 1, retain=True)
    admin = _router_admin(mesh)

    def all_stored() -> bool:
        r = admin.ListRetained(
            rpb.ListRetainedRequest(tenant="default", topic_filter=f"{base}/#", limit=1),
            metadata=MD,
        )
        return bool(len(r.messages)) and r.examined >= 10_010

    # QoS 0 retained publishes carry no ack: wait until all are stored.
    wait_until(all_stored, 30, "10,010 retained messages stored", every_s=0.2)
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe(f"{base}/lab/+/temp", 1)
    assert sorted(int(m.payload) for m in sub.expect(10)) == list(range(10))
    sub.nothing(0.5)
    listed = admin.ListRetained(
        rpb.ListRetainedRequest(tenant="default", topic_filter=f"{base}/lab/+/temp"), metadata=MD
    )
    assert len(listed.messages) == 10
    assert listed.examined < 100  # the index read what matched, not the 10,010 stored
    assert listed.stored >= 10_010
    pub.close()
    sub.close()


def test_delayed_publish_arrives_after_its_delay(mesh: MeshInfo) -> None:
    topic = f"{_t()}/later"
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe(topic, 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    sent = time.monotonic()
    assert int(pub.publish(f"$delayed/3/{topic}", "wake up", 1).value) == 0
    admin = _router_admin(mesh)
    listed = admin.ListDelayed(rpb.ListDelayedRequest(tenant="default"), metadata=MD)
    assert [d.message.topic for d in listed.messages if d.message.topic == topic] == [topic]
    sub.nothing(2.5)  # not before
    (m,) = sub.expect(1, timeout=3)
    assert m.topic == topic and m.payload == b"wake up"
    assert 3.0 <= time.monotonic() - sent <= 4.5  # within a second of its due time
    pub.close()
    sub.close()


def test_delayed_publish_can_be_listed_and_cancelled(mesh: MeshInfo) -> None:
    topic = f"{_t()}/cancel"
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe(topic, 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish(f"$delayed/2/{topic}", "never", 1)
    admin = _router_admin(mesh)
    (d,) = [
        d
        for d in admin.ListDelayed(rpb.ListDelayedRequest(tenant="default"), metadata=MD).messages
        if d.message.topic == topic
    ]
    assert admin.CancelDelayed(
        rpb.CancelDelayedRequest(tenant="default", id=d.id), metadata=MD
    ).cancelled
    sub.nothing(3.0)
    with pytest.raises(grpc.RpcError) as info:
        admin.CancelDelayed(rpb.CancelDelayedRequest(tenant="default", id=d.id), metadata=MD)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    pub.close()
    sub.close()
