"""DUP on deliveries from a persistent session's queue, checked on the wire [MQTT-3.3.1-1]:
DUP=0 on the first attempt to send an entry, DUP=1 only on entries an earlier connection
may have received."""

from __future__ import annotations

import uuid

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from services.common.mqtt.properties import Properties
from starling.session.v1 import session_pb2
from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho, Raw
from tests.poll import wait_until


def _resume(port: int, cid: str, session_present: bool = True) -> Raw:
    raw = Raw(port)
    ack = raw.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=300))
    )
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.session_present is session_present
    return raw


def _offline(mesh: MeshInfo, raw: Raw, cid: str) -> None:
    """DISCONNECT, then wait until the session service no longer lists the client: its old
    connection can no longer take entries from the queue."""
    raw.send(Disconnect())
    assert raw.closed()
    raw.close()
    admin = Admin(mesh)
    request = session_pb2.ListClientsRequest(tenant="default")
    wait_until(
        lambda: all(c.client_id != cid for c in admin.call("ListClients", request).clients),
        10,
        "the disconnected client unlisted",
    )
    admin.channel.close()


def _receive(raw: Raw, n: int) -> list[Publish]:
    got = []
    while len(got) < n:
        p = raw.recv()
        assert isinstance(p, Publish), p
        got.append(p)
    return got


def test_messages_queued_while_offline_arrive_with_dup_0(mesh: MeshInfo) -> None:
    cid, topic = f"d-{uuid.uuid4().hex[:10]}", f"dup0/{uuid.uuid4().hex[:6]}"
    raw = _resume(mesh.node(1), cid, session_present=False)
    raw.send(Subscribe(1, (Subscription(topic, 2),)))
    assert isinstance(raw.recv(), SubAck)
    _offline(mesh, raw, cid)
    pub = Paho(mesh.node(0))
    pub.connect()
    for i, qos in enumerate((1, 2, 1, 2)):
        assert pub.publish(topic, str(i), qos) is not None  # acknowledged: queued
    back = _resume(mesh.node(0), cid)  # the other node
    got = _receive(back, 4)
    assert [(p.payload, p.qos, p.dup) for p in got] == [
        (b"0", 1, False),
        (b"1", 2, False),
        (b"2", 1, False),
        (b"3", 2, False),
    ]
    for p in got:
        if p.qos == 1:
            back.send(PubAck(p.packet_id or 0))
        else:
            back.send(PubRec(p.packet_id or 0))
            rel = back.recv()
            assert isinstance(rel, PubRel) and rel.packet_id == p.packet_id
            back.send(PubComp(p.packet_id or 0))
    _offline(mesh, back, cid)
    third = _resume(mesh.node(1), cid)  # all completed: nothing is sent again
    assert not third.closed(timeout=0.8) and not third.pending
    third.close()
    pub.close()


def test_only_messages_a_connection_received_unacknowledged_come_back_with_dup(
    mesh: MeshInfo,
) -> None:
    cid, topic = f"d-{uuid.uuid4().hex[:10]}", f"dup1/{uuid.uuid4().hex[:6]}"
    raw = _resume(mesh.node(1), cid, session_present=False)
    raw.send(Subscribe(1, (Subscription(topic, 1),)))
    assert isinstance(raw.recv(), SubAck)
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(3):
        pub.publish(topic, f"seen-{i}", 1)
    first = _receive(raw, 3)
    assert [(p.payload, p.dup) for p in first] == [(f"seen-{i}".encode(), False) for i in range(3)]
    _offline(mesh, raw, cid)  # none of them acknowledged
    for i in range(2):
        pub.publish(topic, f"new-{i}", 1)
    back = _resume(mesh.node(0), cid)
    again = _receive(back, 5)
    assert [(p.payload, p.dup) for p in again] == [
        (b"seen-0", True),
        (b"seen-1", True),
        (b"seen-2", True),
        (b"new-0", False),
        (b"new-1", False),
    ]
    # The resends use the packet ids the client already knows.
    assert [p.packet_id for p in again[:3]] == [p.packet_id for p in first]
    for p in again:
        back.send(PubAck(p.packet_id or 0))
    pub.publish(topic, "live", 1)  # while connected: a first attempt too
    live = _receive(back, 1)[0]
    assert (live.payload, live.dup) == (b"live", False)
    back.send(PubAck(live.packet_id or 0))
    _offline(mesh, back, cid)
    third = _resume(mesh.node(1), cid)
    assert not third.closed(timeout=0.8) and not third.pending
    third.close()
    pub.close()
