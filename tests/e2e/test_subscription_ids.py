"""Subscription Identifiers [MQTT-3.3.4-3] on every path a delivery takes: same node, across
the mesh, from a persistent session's queue, retained replay, and shared subscriptions."""

from __future__ import annotations

import uuid

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho


def _ids(p: Paho) -> list[int]:
    (m,) = p.expect(1)
    return sorted(m.properties.SubscriptionIdentifier)


def test_local_and_mesh_deliveries_carry_the_identifier(mesh: MeshInfo) -> None:
    topic = f"sid/{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(0))
    sub.connect()
    sub.subscribe(topic, 1, sub_id=11)
    for node in (0, 1):  # same node, then across the mesh
        pub = Paho(mesh.node(node))
        pub.connect()
        pub.publish(topic, "x", 1)
        assert _ids(sub) == [11]
        pub.close()
    sub.close()


def test_queued_retained_and_shared_deliveries_carry_the_identifier(mesh: MeshInfo) -> None:
    topic = f"sid/{uuid.uuid4().hex[:8]}"
    # A persistent session's queue: subscribed with id 21, offline while the message comes.
    cid = f"sid-{uuid.uuid4().hex[:8]}"
    offline = Paho(mesh.node(0), client_id=cid)
    offline.connect(session_expiry=300)
    offline.subscribe(topic, 1, sub_id=21)
    offline.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    pub.publish(topic, "kept", 1, retain=True)
    back = Paho(mesh.node(1), client_id=cid)
    back.connect(clean_start=False, session_expiry=300)
    assert _ids(back) == [21]
    back.close(session_expiry=0)
    # Retained replay to a new subscription with id 31.
    late = Paho(mesh.node(0))
    late.connect()
    late.subscribe(topic, 1, sub_id=31)
    assert _ids(late) == [31]
    late.close()
    # A shared subscription with id 41.
    member = Paho(mesh.node(0))
    member.connect()
    member.subscribe(f"$share/g/{topic}", 1, sub_id=41)
    pub.publish(topic, "shared", 1)
    assert _ids(member) == [41]
    member.close()
    pub.publish(topic, "", 1, retain=True)  # clear the retained message
    pub.close()
