"""Session semantics end to end with paho-mqtt: every combination of Clean Start, Session
Expiry on CONNECT (absent, 0, > 0) and on DISCONNECT, on the same node and on another node.

The rule [MQTT-3.1.2-4..6]: with Clean Start 0 a stored session is resumed, with everything
queued for it, whatever the new CONNECT says about expiry; the expiry then is what the latest
CONNECT or DISCONNECT said (MQTT 5 sections 3.1.2.11.2 and 3.14.2.2.2).
"""

from __future__ import annotations

import uuid

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho

EXPIRIES = [None, 0, 300]


def _cid() -> str:
    return f"ss-{uuid.uuid4().hex[:10]}"


def _stored_session_with_queue(mesh: MeshInfo, cid: str, topic: str) -> None:
    """A session with expiry 99999 subscribed at QoS 2, offline, with QoS 1 and 2 messages
    queued (acknowledged to their publisher)."""
    sub = Paho(mesh.node(0), client_id=cid)
    sub.connect(clean_start=True, session_expiry=99999)
    sub.subscribe(topic, 2)
    sub.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    for qos in (1, 2):
        assert pub.publish(topic, f"q{qos}", qos) is not None  # PUBACK / PUBCOMP
    pub.close()


@pytest.mark.parametrize("node", [0, 1], ids=["same-node", "other-node"])
@pytest.mark.parametrize("expiry", EXPIRIES, ids=["expiry-absent", "expiry-0", "expiry-300"])
@pytest.mark.parametrize("clean_start", [False, True], ids=["resume", "clean"])
def test_session_matrix(mesh: MeshInfo, node: int, expiry: int | None, clean_start: bool) -> None:
    cid, topic = _cid(), f"ss/{uuid.uuid4().hex[:8]}"
    _stored_session_with_queue(mesh, cid, topic)
    back = Paho(mesh.node(node), client_id=cid)
    back.connect(clean_start=clean_start, session_expiry=expiry)
    assert back.session_present is (not clean_start)
    if clean_start:
        back.nothing()
    else:
        got = sorted(m.payload for m in back.expect(2))
        assert got == [b"q1", b"q2"]
        back.nothing()
    back.close()
    # What is left is what the latest CONNECT said about expiry.
    again = Paho(mesh.node(1 - node), client_id=cid)
    again.connect(clean_start=False, session_expiry=300)
    assert again.session_present is bool(expiry)
    again.close(session_expiry=0)


@pytest.mark.parametrize("disconnect_expiry", [0, 300])
def test_expiry_on_disconnect_decides_what_remains(mesh: MeshInfo, disconnect_expiry: int) -> None:
    cid = _cid()
    c = Paho(mesh.node(0), client_id=cid)
    c.connect(clean_start=True, session_expiry=300)
    c.close(session_expiry=disconnect_expiry)
    again = Paho(mesh.node(0), client_id=cid)  # at once, on the same node
    again.connect(clean_start=False, session_expiry=300)
    assert again.session_present is bool(disconnect_expiry)
    again.close(session_expiry=0)


def test_unexpired_messages_are_delivered_on_resume_with_their_remaining_expiry(
    mesh: MeshInfo,
) -> None:
    cid, topic = _cid(), f"ss/{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(0), client_id=cid)
    sub.connect(clean_start=True, session_expiry=99999)
    sub.subscribe(topic, 1)
    sub.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 300
    assert pub.publish(topic, b"fresh", 1, props=props) is not None
    pub.close()
    back = Paho(mesh.node(1), client_id=cid)
    back.connect(clean_start=False)  # no Session Expiry: 0 from now on
    assert back.session_present is True
    m = back.expect(1)[0]
    assert m.payload == b"fresh"
    assert 0 < m.properties.MessageExpiryInterval <= 300
    back.close()


@pytest.mark.parametrize("clean", [False, True], ids=["clean-session-0", "clean-session-1"])
def test_v311_clean_session(mesh: MeshInfo, clean: bool) -> None:
    cid, topic = _cid(), f"ss/{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(0), client_id=cid, v5=False, clean=False)
    sub.connect()
    sub.subscribe(topic, 1)
    sub.close()
    pub = Paho(mesh.node(1))
    pub.connect()
    assert pub.publish(topic, b"m", 1) is not None
    pub.close()
    back = Paho(mesh.node(1), client_id=cid, v5=False, clean=clean)
    back.connect()
    assert back.session_present is (not clean)
    if clean:
        back.nothing()
    else:
        assert back.expect(1)[0].payload == b"m"
    back.close()
