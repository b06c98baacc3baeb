"""MQTT 5 conformance: the normative statements a server must enforce, checked on the wire
against the two-node mesh; here a connection's life (CONNECT, redirection, PINGREQ,
DISCONNECT), in test_mqtt5_messages.py the messages (PUBLISH, aliases, subscriptions,
retained, expiry, flow control, shared subscriptions). Test names carry the statement id
(`MQTT_3_1_0_1` is [MQTT-3.1.0-1]); statements the specification states without an id carry
their section (`S3_1_2_11_3` is section 3.1.2.11.3). docs/conformance.md lists them by
feature.
"""

from __future__ import annotations

import time

import pytest

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    Publish,
    Subscription,
    Will,
)
from tests.conformance.wire import (
    closed_silently,
    connect,
    connected,
    disconnected_with,
    next_publish,
    publish_acked,
    subscribe,
    uid,
)
from tests.conftest import MeshInfo
from tests.e2e.clients import Raw

pytestmark = pytest.mark.e2e

# ---- CONNECT -------------------------------------------------------------------------------


def test_MQTT_3_1_0_1_first_packet_must_be_connect(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    raw.send(Publish("t", b"x"))
    closed_silently(raw)


def test_MQTT_3_1_0_2_second_connect_is_a_protocol_error(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Connect(uid("again"), 5))
    disconnected_with(raw, 0x82)


def test_MQTT_3_1_2_1_wrong_protocol_name_is_refused(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(bytes.fromhex("10 0d 0004 4d515458 05 02 003c 00 0000"))  # "MQTX" level 5
    assert raw.closed()
    assert all(isinstance(p, ConnAck) and p.reason_code for p in raw.pending)


def test_MQTT_3_1_2_2_unsupported_protocol_version_gets_0x84(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1), level=4)  # a server that does not know the level answers as 3.1.1
    raw.send(bytes.fromhex("10 0d 0004 4d515454 06 02 003c 00 0000"))  # level 6
    ack = raw.recv()
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x84  # return code 1
    assert raw.closed()


def test_MQTT_3_1_2_3_reserved_connect_flag_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    raw.send(bytes.fromhex("10 0d 0004 4d515454 05 03 003c 00 0000"))  # flags 0x03
    closed_silently(raw)


def test_MQTT_3_1_2_4_clean_start_discards_the_session(mesh: MeshInfo) -> None:
    cid, topic = uid("cs1"), uid("cs1/t")
    props = Properties(session_expiry_interval=300)
    sub = connected(mesh.node(0), cid, props=props)
    subscribe(sub, Subscription(topic, 1))
    sub.send(Disconnect())
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"queued", 1, packet_id=1))
    again, ack = connect(mesh.node(0), cid, clean_start=True, props=props)
    assert ack.reason_code == 0 and not ack.session_present  # [MQTT-3.2.2-2]
    publish_acked(pub, Publish(topic, b"after", 1, packet_id=2))
    again.send(PingReq())
    assert isinstance(again.recv(), PingResp)  # no queued message, no subscription left
    assert not again.pending


def test_MQTT_3_1_2_5_clean_start_0_resumes_the_session(mesh: MeshInfo) -> None:
    cid, topic = uid("cs0"), uid("cs0/t")
    props = Properties(session_expiry_interval=300)
    sub = connected(mesh.node(0), cid, props=props)
    subscribe(sub, Subscription(topic, 1))
    sub.send(Disconnect())
    assert sub.closed()
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"queued", 1, packet_id=1))
    again, ack = connect(mesh.node(1), cid, clean_start=False, props=props)
    assert ack.session_present  # [MQTT-3.2.2-3]
    assert next_publish(again).payload == b"queued"


def test_MQTT_3_1_2_6_clean_start_0_without_session_starts_one(mesh: MeshInfo) -> None:
    _, ack = connect(mesh.node(0), uid("fresh"), clean_start=False)
    assert ack.reason_code == 0 and not ack.session_present


def test_MQTT_3_1_2_8_will_published_when_the_connection_drops(mesh: MeshInfo) -> None:
    topic = uid("will/t")
    watcher = connected(mesh.node(1))
    subscribe(watcher, Subscription(topic, 1))
    dying = connected(mesh.node(0), will=Will(topic, b"gone", 1))
    dying.close()  # no DISCONNECT
    assert next_publish(watcher).payload == b"gone"


def test_MQTT_3_1_2_10_normal_disconnect_discards_the_will(mesh: MeshInfo) -> None:
    topic = uid("will/n")
    watcher = connected(mesh.node(1))
    subscribe(watcher, Subscription(topic, 1))
    polite = connected(mesh.node(0), will=Will(topic, b"must not come", 1))
    polite.send(Disconnect(0))
    assert polite.closed()
    with_will = connected(mesh.node(0), will=Will(topic, b"sentinel", 1))
    with_will.send(Disconnect(0x04))  # Disconnect with Will Message: published
    assert next_publish(watcher).payload == b"sentinel"


def test_MQTT_3_1_2_11_will_qos_without_will_flag_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    raw.send(bytes.fromhex("10 0d 0004 4d515454 05 0a 003c 00 0000"))  # will QoS 1, no flag
    closed_silently(raw)


def test_MQTT_3_1_2_22_silent_client_closed_after_one_and_a_half_keep_alive(
    mesh: MeshInfo,
) -> None:
    raw = connected(mesh.node(0), keepalive_s=1)
    started = time.monotonic()
    disconnected_with(raw, 0x8D)
    assert time.monotonic() - started >= 1.4  # not before 1.5 x the keep alive


def test_MQTT_3_1_2_24_server_never_sends_more_than_maximum_packet_size(mesh: MeshInfo) -> None:
    topic = uid("mps/t")
    sub = connected(mesh.node(0), props=Properties(maximum_packet_size=128))
    subscribe(sub, Subscription(topic, 1))
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"x" * 200, 1, packet_id=1))
    publish_acked(pub, Publish(topic, b"small", 1, packet_id=2))
    got = next_publish(sub)
    assert got.payload == b"small"  # the large one was never sent


def test_MQTT_3_1_2_25_too_large_message_counts_as_sent(mesh: MeshInfo) -> None:
    """QoS 1 from a persistent session's queue: the large one is settled as if delivered,
    the next one flows, and a resume does not bring the large one back."""
    cid, topic = uid("mps-q"), uid("mps/q")
    props = Properties(session_expiry_interval=300, maximum_packet_size=128)
    sub = connected(mesh.node(0), cid, props=props)
    subscribe(sub, Subscription(topic, 1))
    sub.send(Disconnect())
    assert sub.closed()
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"x" * 200, 1, packet_id=1))
    publish_acked(pub, Publish(topic, b"next", 1, packet_id=2))
    again = connected(mesh.node(0), cid, clean_start=False, props=props)
    assert next_publish(again).payload == b"next"
    again.send(Disconnect())
    assert again.closed()
    publish_acked(pub, Publish(topic, b"last", 1, packet_id=3))
    third = connected(mesh.node(1), cid, clean_start=False, props=props)
    assert next_publish(third).payload == b"last"  # nothing of the large one is left


@pytest.mark.parametrize("prop", ["receive_maximum", "maximum_packet_size"])
def test_S3_1_2_11_zero_receive_maximum_or_packet_size_is_a_protocol_error(
    mesh: MeshInfo, prop: str
) -> None:
    raw = Raw(mesh.node(0))
    raw.send(Connect(uid("zero"), 5, properties=Properties(**{prop: 0})))
    assert raw.closed()
    assert not [p for p in raw.pending if isinstance(p, ConnAck) and p.reason_code == 0]


def test_MQTT_3_1_2_28_no_response_information_unless_requested(mesh: MeshInfo) -> None:
    _, ack = connect(mesh.node(0))
    assert ack.properties.response_information is None
    _, ack = connect(mesh.node(0), props=Properties(request_response_information=0))
    assert ack.properties.response_information is None


def test_S3_1_2_11_7_response_information_is_a_usable_topic_prefix(mesh: MeshInfo) -> None:
    cid = uid("rr")
    requester, ack = connect(mesh.node(0), cid, props=Properties(request_response_information=1))
    prefix = ack.properties.response_information
    assert prefix == f"$response/{cid}"
    subscribe(requester, Subscription(f"{prefix}/#", 1))
    responder = connected(mesh.node(1))
    publish_acked(responder, Publish(f"{prefix}/answer", b"42", 1, packet_id=1))
    assert next_publish(requester).payload == b"42"


def test_MQTT_3_1_2_29_request_problem_information_0(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), props=Properties(request_problem_information=0))
    ack = publish_acked(raw, Publish("$SYS/x", b"x", 1, packet_id=1))
    assert ack.reason_code == 0x87 and ack.properties.reason_string is None
    raw.send(bytes.fromhex("36 05 0001 61 0001"))  # QoS 3: DISCONNECT may still explain
    assert disconnected_with(raw, 0x81).properties.reason_string


def test_MQTT_3_1_3_6_empty_client_id_gets_one_assigned(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1))
    ack = raw.connect(Connect("", 5))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.properties.assigned_client_identifier  # [MQTT-3.1.3-7]


def test_MQTT_3_1_3_8_refused_client_id_gets_0x85(mesh: MeshInfo) -> None:
    raw, ack = connect(mesh.node(0), "x" * 300)  # longer than max_client_id_length
    assert ack.reason_code == 0x85 and not ack.session_present  # [MQTT-3.2.2-6]
    assert raw.closed()  # [MQTT-3.2.2-7]


def test_MQTT_4_7_3_1_empty_will_topic_is_a_protocol_error(mesh: MeshInfo) -> None:
    raw, ack = connect(mesh.node(0), will=Will("", b"x"))
    assert ack.reason_code == 0x82
    assert raw.closed()


def test_MQTT_3_1_4_6_nothing_after_a_refused_connect_is_processed(mesh: MeshInfo) -> None:
    topic = uid("refused/t")
    watcher = connected(mesh.node(1))
    subscribe(watcher, Subscription(topic, 1))
    raw = Raw(mesh.node(0))
    refused = Connect(uid("bad"), 5, username="closedtenant/nobody", password=b"wrong")
    raw.send(refused)
    raw.send(Publish(topic, b"must not come", 1, packet_id=1))
    ack = raw.recv()
    assert isinstance(ack, ConnAck) and ack.reason_code >= 0x80 and ack.properties.reason_string
    assert raw.closed() and not raw.pending
    sentinel = connected(mesh.node(0))
    publish_acked(sentinel, Publish(topic, b"sentinel", 1, packet_id=1))
    assert next_publish(watcher).payload == b"sentinel"


# ---- server redirection (4.11) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant", "code", "reference"),
    [("moved", 0x9D, "new.example:1883"), ("busy", 0x9C, "other.example:1883")],
)
def test_S4_11_redirected_tenant_gets_server_reference(
    mesh: MeshInfo, tenant: str, code: int, reference: str
) -> None:
    raw, ack = connect(mesh.node(0), username=f"{tenant}/dev")
    assert ack.reason_code == code
    assert ack.properties.server_reference == reference
    assert raw.closed()


# ---- PINGREQ, DISCONNECT -------------------------------------------------------------------


def test_MQTT_3_12_4_1_pingreq_gets_pingresp(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(1))
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)


def test_MQTT_3_14_1_1_disconnect_reserved_flags_close(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("e1 00"))
    disconnected_with(raw, 0x81)


def test_MQTT_3_14_2_2_session_expiry_on_disconnect_after_0_is_a_protocol_error(
    mesh: MeshInfo,
) -> None:
    raw = connected(mesh.node(0))  # CONNECT without Session Expiry: 0
    raw.send(Disconnect(0, Properties(session_expiry_interval=60)))
    disconnected_with(raw, 0x82)


def test_MQTT_3_1_4_3_session_taken_over_gets_0x8e(mesh: MeshInfo) -> None:
    cid = uid("takeover")
    first = connected(mesh.node(0), cid)
    connected(mesh.node(1), cid)
    disconnected_with(first, 0x8E)
