"""Persistent sessions on the shared mesh: offline queueing, resume on any node, expiry,
DUP resends and outbound QoS 2 state across reconnects."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

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
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho, Raw
from tests.poll import wait_until


def _cid() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("v5", [True, False], ids=["v5", "v311"])
def test_offline_subscriber_gets_queued_messages_on_any_node(mesh: MeshInfo, v5: bool) -> None:
    cid = _cid()
    sub = Paho(mesh.node(1), client_id=cid, v5=v5, clean=False)
    sub.connect(clean_start=False, session_expiry=300)
    assert sub.session_present is False
    sub.subscribe(f"off/{cid}", 1)
    sub.close()
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(20):
        assert pub.publish(f"off/{cid}", str(i), 1) is not None  # acknowledged: stored
    back = Paho(mesh.node(0), client_id=cid, v5=v5, clean=False)  # another node
    back.connect(clean_start=False, session_expiry=300)
    assert back.session_present is True
    got = back.expect(20)
    assert [m.payload for m in got] == [str(i).encode() for i in range(20)]
    back.nothing()
    # The resumed session still routes new messages.
    pub.publish(f"off/{cid}", "live", 1)
    assert back.expect(1)[0].payload == b"live"
    back.close()
    pub.close()


def test_clean_start_discards_the_session(mesh: MeshInfo) -> None:
    cid = _cid()
    sub = Paho(mesh.node(0), client_id=cid)
    sub.connect(clean_start=False, session_expiry=300)
    sub.subscribe(f"cs/{cid}", 1)
    sub.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    pub.publish(f"cs/{cid}", "old", 1)
    fresh = Paho(mesh.node(1), client_id=cid)
    fresh.connect(clean_start=True, session_expiry=300)
    assert fresh.session_present is False
    fresh.nothing(0.8)
    pub.publish(f"cs/{cid}", "after", 1)  # the old subscription is gone too
    fresh.nothing(0.5)
    fresh.close()
    pub.close()


def _queue_rows(mesh: MeshInfo, client_id: str, where: str = "") -> int:
    db = Path(mesh.mesh.data_dir) / "data" / "queues.db"
    with sqlite3.connect(db) as conn:
        return int(
            conn.execute(
                f"SELECT count(*) FROM queue_entries WHERE queue_id LIKE ?{where}",
                (f"{client_id}#%",),
            ).fetchone()[0]
        )


def _released_rows(mesh: MeshInfo, client_id: str) -> int:
    """Entries whose PUBREC the node recorded (QoS 2 outbound: PUBREL due)."""
    return _queue_rows(mesh, client_id, " AND released = 1")


def test_expired_session_and_its_queue_are_gone(mesh: MeshInfo) -> None:
    cid = _cid()
    sub = Paho(mesh.node(0), client_id=cid)
    sub.connect(clean_start=False, session_expiry=1)
    sub.subscribe(f"exp/{cid}", 1)
    sub.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    for i in range(3):
        pub.publish(f"exp/{cid}", str(i), 1)
    assert _queue_rows(mesh, cid) == 3
    wait_until(lambda: not _queue_rows(mesh, cid), 10, "the expired session's queue gone", 0.1)
    back = Paho(mesh.node(0), client_id=cid)
    back.connect(clean_start=False, session_expiry=60)
    assert back.session_present is False
    back.nothing(0.8)
    back.close()
    pub.close()


def _persistent_raw(port: int, cid: str, topic: str, qos: int) -> Raw:
    raw = Raw(port)
    ack = raw.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=300))
    )
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    raw.send(Subscribe(1, (Subscription(topic, qos),)))
    assert isinstance(raw.recv(), SubAck)
    return raw


def test_unacked_message_is_resent_with_dup(mesh: MeshInfo) -> None:
    cid, topic = _cid(), f"dup/{uuid.uuid4().hex[:6]}"
    raw = _persistent_raw(mesh.node(1), cid, topic, 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish(topic, "once", 1)
    first = raw.recv()
    assert isinstance(first, Publish) and not first.dup
    raw.close()  # no PUBACK
    again = Raw(mesh.node(0))
    ack = again.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=300))
    )
    assert isinstance(ack, ConnAck) and ack.session_present
    resent = again.recv()
    assert isinstance(resent, Publish) and resent.dup and resent.payload == b"once"
    assert resent.packet_id == first.packet_id
    again.send(PubAck(resent.packet_id or 0))
    again.send(Disconnect())
    third = Raw(mesh.node(1))
    third.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=300))
    )
    assert not third.closed(timeout=0.8) and not third.pending  # acked: not sent again
    pub.close()


def test_outbound_qos2_state_survives_reconnection(mesh: MeshInfo) -> None:
    cid, topic = _cid(), f"q2/{uuid.uuid4().hex[:6]}"
    raw = _persistent_raw(mesh.node(0), cid, topic, 2)
    pub = Paho(mesh.node(1))
    pub.connect()
    pub.publish(topic, "exactly-once", 2)
    p = raw.recv()
    assert isinstance(p, Publish) and p.qos == 2
    raw.send(PubRec(p.packet_id or 0))
    assert isinstance(raw.recv(), PubRel)
    # The node records the PUBREC (the entry's released mark) before the connection drops.
    wait_until(lambda: _released_rows(mesh, cid) == 1, 10, "the PUBREC recorded")
    raw.close()  # no PUBCOMP
    again = Raw(mesh.node(1))
    again.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=300))
    )
    rel = again.recv()
    assert isinstance(rel, PubRel) and rel.packet_id == p.packet_id  # not a new PUBLISH
    again.send(PubComp(rel.packet_id))
    assert not again.closed(timeout=0.6) and not again.pending
    pub.close()
