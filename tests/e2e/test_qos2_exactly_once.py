"""QoS 2 exactly once across reconnects to the OTHER node of the mesh, on the wire, for
MQTT 3.1.1 and 5: the receiver state travels with the persistent session (a resent PUBLISH
is not stored twice, a resent PUBREL is completed), and a delivery the client PUBREC'd comes
back as PUBREL, never as a second PUBLISH."""

from __future__ import annotations

import uuid

import pytest

from services.common.mqtt import (
    ConnAck,
    Connect,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from services.common.mqtt.properties import EMPTY, Properties
from tests.conftest import MeshInfo
from tests.e2e.clients import Raw

LEVELS = pytest.mark.parametrize("level", [4, 5], ids=["mqtt311", "mqtt5"])


def _session(port: int, cid: str, level: int, present: bool) -> Raw:
    """A persistent session (3.1.1 clean session 0; MQTT 5 expiry 300 s) on `port`."""
    raw = Raw(port, level)
    props = Properties(session_expiry_interval=300) if level == 5 else EMPTY
    ack = raw.connect(Connect(cid, level, clean_start=False, properties=props))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.session_present is present
    return raw


def _subscriber(port: int, level: int, topic: str) -> tuple[Raw, str]:
    cid = f"q2s-{uuid.uuid4().hex[:10]}"
    raw = _session(port, cid, level, False)
    raw.send(Subscribe(1, (Subscription(topic, 2),)))
    assert isinstance(raw.recv(), SubAck)
    return raw, cid


def _publish_exactly_once(raw: Raw, topic: str, payload: bytes, pid: int) -> None:
    raw.send(Publish(topic, payload, 2, False, False, pid))
    assert raw.recv() == PubRec(pid)
    raw.send(PubRel(pid))
    assert raw.recv() == PubComp(pid)


def _take(raw: Raw, n: int) -> list[bytes]:
    """The next `n` deliveries, in order, each completed (PUBREC, PUBREL, PUBCOMP)."""
    got: list[bytes] = []
    releasing: set[int] = set()
    while len(got) < n or releasing:
        p = raw.recv()
        if isinstance(p, Publish):
            assert p.qos == 2, p
            got.append(p.payload)
            releasing.add(p.packet_id or 0)
            raw.send(PubRec(p.packet_id or 0))
        else:
            assert isinstance(p, PubRel) and p.packet_id in releasing, p
            releasing.discard(p.packet_id)
            raw.send(PubComp(p.packet_id))
    return got


@LEVELS
def test_a_publish_resent_on_the_other_node_is_delivered_once(mesh: MeshInfo, level: int) -> None:
    topic = f"q2/{uuid.uuid4().hex[:8]}"
    sub, _ = _subscriber(mesh.node(1), level, topic)
    cid = f"q2p-{uuid.uuid4().hex[:10]}"
    pub = _session(mesh.node(0), cid, level, False)
    pub.send(Publish(topic, b"once", 2, False, False, 7))
    pub.close()  # dropped before the PUBREC was read
    again = _session(mesh.node(1), cid, level, True)
    again.send(Publish(topic, b"once", 2, False, True, 7))  # the resend [MQTT-4.4.0-1]
    assert again.recv() == PubRec(7)
    again.send(PubRel(7))
    assert again.recv() == PubComp(7)
    _publish_exactly_once(again, topic, b"marker", 8)
    # Stored once: the subscriber's next delivery after it is the marker, not a copy.
    assert _take(sub, 2) == [b"once", b"marker"]
    again.close()
    sub.close()


@LEVELS
def test_a_pubrel_resent_on_the_other_node_is_completed(mesh: MeshInfo, level: int) -> None:
    topic = f"q2/{uuid.uuid4().hex[:8]}"
    sub, _ = _subscriber(mesh.node(0), level, topic)
    cid = f"q2p-{uuid.uuid4().hex[:10]}"
    pub = _session(mesh.node(0), cid, level, False)
    pub.send(Publish(topic, b"released", 2, False, False, 3))
    assert pub.recv() == PubRec(3)
    pub.close()  # the PUBREL never got there
    again = _session(mesh.node(1), cid, level, True)
    again.send(PubRel(3))
    comp = again.recv()
    # The id was known to the session: 0x00, not 0x92 Packet Identifier not found.
    assert comp == PubComp(3) and comp.reason_code == 0
    # The id is free again: a new message under it is a new message, not a resend.
    _publish_exactly_once(again, topic, b"next", 3)
    assert _take(sub, 2) == [b"released", b"next"]
    again.close()
    sub.close()


@LEVELS
def test_a_delivery_pubrecd_before_the_connection_died_comes_back_as_pubrel(
    mesh: MeshInfo, level: int
) -> None:
    topic = f"q2/{uuid.uuid4().hex[:8]}"
    sub, cid = _subscriber(mesh.node(0), level, topic)
    pub = _session(mesh.node(1), f"q2p-{uuid.uuid4().hex[:10]}", level, False)
    _publish_exactly_once(pub, topic, b"one", 1)
    p = sub.recv()
    assert isinstance(p, Publish) and p.payload == b"one"
    pid = p.packet_id or 0
    sub.send(PubRec(pid))
    assert sub.recv() == PubRel(pid)  # sent once the queue holds the entry as released
    sub.close()  # killed before its PUBCOMP
    back = _session(mesh.node(1), cid, level, True)
    assert back.recv() == PubRel(pid)  # the client forgot the message: PUBREL, no PUBLISH
    back.send(PubComp(pid))
    _publish_exactly_once(pub, topic, b"two", 2)
    assert _take(back, 1) == [b"two"]
    back.close()
    pub.close()
