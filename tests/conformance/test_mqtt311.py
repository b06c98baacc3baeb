"""MQTT 3.1.1 (and 3.1) conformance: the normative statements of 3.1.1 a server must enforce,
on the wire against the mesh. Ids are those of the 3.1.1 specification, which differ from
MQTT 5's for the same rule (3.1.1's [MQTT-3.1.2-24] is the keep alive, 5's the packet size).
3.1.1 has no reason codes: a violation closes the connection without a word.
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
    PubAck,
    Publish,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from tests.conformance.wire import (
    closed_silently,
    connect,
    connected,
    next_publish,
    publish_acked,
    subscribe,
    uid,
)
from tests.conftest import MeshInfo
from tests.e2e.clients import Raw

pytestmark = pytest.mark.e2e


def test_MQTT_3_1_0_1_first_packet_must_be_connect(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(PingReq())
    closed_silently(raw)


def test_MQTT_3_1_0_2_second_connect_closes(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(Connect(uid("again"), 4))
    closed_silently(raw)


def test_MQTT_3_1_2_1_wrong_protocol_name_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(bytes.fromhex("10 0c 0004 4d515458 04 02 003c 0000"))  # "MQTX"
    assert raw.closed()
    assert all(isinstance(p, ConnAck) and p.reason_code for p in raw.pending)


def test_MQTT_3_1_2_2_unsupported_level_gets_return_code_1(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1), level=4)
    raw.send(bytes.fromhex("10 0c 0004 4d515454 02 02 003c 0000"))  # level 2
    ack = raw.recv()
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x84  # decoded from return code 1
    assert raw.closed()


def test_MQTT_3_1_2_3_reserved_flag_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(bytes.fromhex("10 0c 0004 4d515454 04 03 003c 0000"))
    closed_silently(raw)


def test_MQTT_3_1_2_8_will_published_when_the_connection_drops(mesh: MeshInfo) -> None:
    topic = uid("will311/t")
    watcher = connected(mesh.node(1), level=4)
    subscribe(watcher, Subscription(topic, 1))
    dying = connected(mesh.node(0), level=4, will=Will(topic, b"gone", 1))
    dying.close()
    assert next_publish(watcher).payload == b"gone"


def test_MQTT_3_1_2_10_disconnect_discards_the_will(mesh: MeshInfo) -> None:
    topic = uid("will311/n")
    watcher = connected(mesh.node(1), level=4)
    subscribe(watcher, Subscription(topic, 1))
    polite = connected(mesh.node(0), level=4, will=Will(topic, b"must not come", 1))
    polite.send(Disconnect())
    assert polite.closed()
    dying = connected(mesh.node(0), level=4, will=Will(topic, b"sentinel", 1))
    dying.close()
    assert next_publish(watcher).payload == b"sentinel"


def test_MQTT_3_1_2_14_will_qos_3_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    # flags: will flag + will QoS 3; will topic "w", will message empty
    raw.send(bytes.fromhex("10 11 0004 4d515454 04 1e 003c 0001 63 0001 77 0000"))
    closed_silently(raw)


def test_MQTT_3_1_2_22_password_without_user_name_closes(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(bytes.fromhex("10 0f 0004 4d515454 04 42 003c 0001 63 0000"))
    closed_silently(raw)


def test_MQTT_3_1_2_24_silent_client_closed_after_one_and_a_half_keep_alive(
    mesh: MeshInfo,
) -> None:
    raw = connected(mesh.node(1), level=4, keepalive_s=1)
    started = time.monotonic()
    closed_silently(raw)
    assert time.monotonic() - started >= 1.4


def test_MQTT_3_1_3_8_empty_client_id_with_clean_session_0_gets_return_code_2(
    mesh: MeshInfo,
) -> None:
    raw, ack = connect(mesh.node(0), "", level=4, clean_start=False)
    assert ack.reason_code == 0x85 and not ack.session_present  # rc 2 [MQTT-3.2.2-4]
    assert raw.closed()  # [MQTT-3.2.2-5]


def test_MQTT_3_1_3_6_empty_client_id_with_clean_session_1_is_accepted(mesh: MeshInfo) -> None:
    _, ack = connect(mesh.node(0), "", level=4, clean_start=True)
    assert ack.reason_code == 0


def test_MQTT_4_7_3_1_empty_will_topic_closes_without_connack(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)
    raw.send(Connect(uid("w0"), 4, will=Will("", b"x")))
    closed_silently(raw)  # [MQTT-3.1.4-1]: no return code fits


def test_MQTT_3_2_2_1_clean_session_1_session_present_0(mesh: MeshInfo) -> None:
    cid = uid("sp")
    connected(mesh.node(0), cid, level=4, clean_start=False).send(Disconnect())
    _, ack = connect(mesh.node(1), cid, level=4, clean_start=True)
    assert ack.reason_code == 0 and not ack.session_present


def test_MQTT_3_2_2_2_stored_session_session_present_1(mesh: MeshInfo) -> None:
    cid, topic = uid("sp1"), uid("sp1/t")
    first = connected(mesh.node(0), cid, level=4, clean_start=False)
    subscribe(first, Subscription(topic, 1))
    first.send(Disconnect())
    assert first.closed()
    pub = connected(mesh.node(1), level=4)
    publish_acked(pub, Publish(topic, b"queued", 1, packet_id=1))
    again, ack = connect(mesh.node(1), cid, level=4, clean_start=False)
    assert ack.session_present
    assert next_publish(again).payload == b"queued"


def test_MQTT_3_1_session_present_is_never_set(mesh: MeshInfo) -> None:
    """MQTT 3.1 (MQIsdp) has no Session Present flag: the byte is 0 even on a resume."""
    cid, topic = uid("v31"), uid("v31/t")
    first = connected(mesh.node(0), cid, level=3, clean_start=False)
    subscribe(first, Subscription(topic, 1))
    first.send(Disconnect())
    assert first.closed()
    pub = connected(mesh.node(1), level=4)
    publish_acked(pub, Publish(topic, b"queued", 1, packet_id=1))
    raw = Raw(mesh.node(0), level=3)
    raw.send(Connect(cid, 3, protocol_name="MQIsdp", clean_start=False))
    raw.sock.settimeout(10)
    connack = raw.sock.recv(4)
    assert connack == bytes.fromhex("20 02 00 00")
    assert next_publish(raw).payload == b"queued"  # the session was resumed all the same


def test_MQTT_3_3_1_4_qos_3_closes(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(bytes.fromhex("36 05 0001 61 0001"))
    closed_silently(raw)


def test_MQTT_3_3_2_2_wildcard_in_topic_name_closes(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(Publish("a/+", b"x", 0))
    closed_silently(raw)


def test_MQTT_3_3_5_2_unauthorized_publish_is_acknowledged_and_dropped(mesh: MeshInfo) -> None:
    topic = "$SYS/" + uid("forged")
    watcher = connected(mesh.node(1), level=4)
    subscribe(watcher, Subscription(topic, 1))
    raw = connected(mesh.node(0), level=4)
    assert publish_acked(raw, Publish(topic, b"x", 1, packet_id=1)) == PubAck(1)
    watcher.send(PingReq())
    assert isinstance(watcher.recv(), PingResp) and not watcher.pending


def test_MQTT_3_3_1_8_9_retain_flag_on_new_and_established_subscriptions(
    mesh: MeshInfo,
) -> None:
    topic = uid("ret311/t")
    pub = connected(mesh.node(1), level=4)
    publish_acked(pub, Publish(topic, b"kept", 1, retain=True, packet_id=1))
    raw = connected(mesh.node(0), level=4)
    subscribe(raw, Subscription(topic, 1))
    first = next_publish(raw)
    assert first.retain and first.payload == b"kept"  # [MQTT-3.3.1-8]
    publish_acked(pub, Publish(topic, b"live", 1, retain=True, packet_id=2))
    live = next_publish(raw)
    assert live.payload == b"live" and not live.retain  # [MQTT-3.3.1-9]


def test_MQTT_3_3_1_10_11_zero_byte_retained_deletes(mesh: MeshInfo) -> None:
    topic = uid("ret311/d")
    pub = connected(mesh.node(1), level=4)
    publish_acked(pub, Publish(topic, b"kept", 1, retain=True, packet_id=1))
    publish_acked(pub, Publish(topic, b"", 1, retain=True, packet_id=2))
    raw = connected(mesh.node(0), level=4)
    subscribe(raw, Subscription(topic, 1))
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)


def test_MQTT_3_8_1_1_subscribe_with_bad_flags_closes(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(bytes.fromhex("80 06 0001 0001 61 00"))
    closed_silently(raw)


def test_MQTT_3_8_3_4_reserved_bits_in_requested_qos_close(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(bytes.fromhex("82 06 0001 0001 61 04"))  # no-local bit: reserved in 3.1.1
    closed_silently(raw)


def test_MQTT_3_9_3_2_invalid_filter_gets_0x80(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    ack = subscribe(raw, Subscription("ok/t", 1), Subscription("a/#/b", 1))
    assert ack.reason_codes == (1, 0x80)  # [MQTT-3.9.3-1] in filter order


def test_MQTT_3_10_4_5_unsuback_even_when_nothing_was_subscribed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(Unsubscribe(9, ("never",)))
    assert raw.recv() == UnsubAck(9)


def test_MQTT_3_12_4_1_pingreq_gets_pingresp(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)


def test_MQTT_3_14_1_1_disconnect_reserved_flags_close(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0), level=4)
    raw.send(bytes.fromhex("e2 00"))
    closed_silently(raw)


def test_MQTT_3_1_4_2_same_client_id_takes_the_connection_over(mesh: MeshInfo) -> None:
    cid = uid("take311")
    first = connected(mesh.node(0), cid, level=4)
    connected(mesh.node(1), cid, level=4)
    closed_silently(first)
