"""MQTT 5 conformance of messages: PUBLISH and its fixed header, topic aliases, subscriptions,
retained messages, message expiry, receive maximum and shared subscriptions, checked on the
wire against the two-node mesh (a connection's life: test_mqtt5.py). Test names carry the
statement id (`MQTT_3_1_0_1` is [MQTT-3.1.0-1]); statements the specification states
without an id carry their section (`S3_1_2_11_3` is section 3.1.2.11.3).
docs/conformance.md lists them by feature.
"""

from __future__ import annotations

import time

import pytest

from services.common.mqtt import (
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    encode,
)
from tests.conformance.wire import (
    connect,
    connected,
    disconnected_with,
    next_publish,
    publish_acked,
    subscribe,
    uid,
)
from tests.conftest import MeshInfo

pytestmark = pytest.mark.e2e

# ---- fixed header, packet identifiers, PUBLISH -----------------------------------------------


def test_MQTT_2_1_3_1_bad_fixed_header_flags_close_with_0x81(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("80 06 0001 0001 61 00"))  # SUBSCRIBE with flags 0 instead of 2
    disconnected_with(raw, 0x81)


def test_MQTT_2_2_1_3_packet_identifier_0_is_malformed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("32 06 0001 61 0000 00"))  # QoS 1 PUBLISH with packet id 0
    disconnected_with(raw, 0x81)


def test_MQTT_3_3_1_2_dup_on_qos_0_is_malformed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(1))
    raw.send(bytes.fromhex("38 04 0001 61 00"))
    disconnected_with(raw, 0x81)


def test_MQTT_3_3_1_4_qos_3_is_malformed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("36 06 0001 61 0001 00"))
    disconnected_with(raw, 0x81)


def test_MQTT_3_3_2_2_wildcard_in_topic_name_gets_0x90(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Publish("a/#", b"x", 1, packet_id=1))
    disconnected_with(raw, 0x90)


def test_MQTT_3_3_4_6_subscription_identifier_from_a_client_is_a_protocol_error(
    mesh: MeshInfo,
) -> None:
    raw = connected(mesh.node(0))
    raw.send(Publish("t", b"x", 0, properties=Properties(subscription_identifier=(5,))))
    disconnected_with(raw, 0x82)


def test_S4_7_sys_topics_are_refused_with_0x87(mesh: MeshInfo) -> None:
    topic = "$SYS/" + uid("fake")
    watcher = connected(mesh.node(1))
    subscribe(watcher, Subscription(topic, 1))
    raw = connected(mesh.node(0))
    ack = publish_acked(raw, Publish(topic, b"forged", 1, packet_id=1))
    assert ack.reason_code == 0x87 and "$SYS" in (ack.properties.reason_string or "")
    raw.send(Publish(topic, b"forged", 2, packet_id=2))
    rec = raw.recv()
    assert isinstance(rec, PubRec) and rec.reason_code == 0x87
    watcher.send(PingReq())
    assert isinstance(watcher.recv(), PingResp) and not watcher.pending


def test_MQTT_3_3_1_1_first_delivery_from_a_queue_has_dup_0(mesh: MeshInfo) -> None:
    cid, topic = uid("dup"), uid("dup/t")
    props = Properties(session_expiry_interval=300)
    sub = connected(mesh.node(0), cid, props=props)
    subscribe(sub, Subscription(topic, 1))
    sub.send(Disconnect())
    assert sub.closed()
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"never sent before", 1, packet_id=1))
    again = connected(mesh.node(0), cid, clean_start=False, props=props)
    assert not next_publish(again).dup  # [MQTT-3.3.1-3] DUP 1 only on a resend


def test_MQTT_3_3_4_1_each_qos_gets_its_answer(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Publish("qos/t", b"0", 0))
    raw.send(Publish("qos/t", b"1", 1, packet_id=1))
    raw.send(Publish("qos/t", b"2", 2, packet_id=2))
    assert raw.recv() == PubAck(1) and raw.recv() == PubRec(2)
    raw.send(PubRel(2))
    assert raw.recv() == PubComp(2)


# ---- topic aliases -------------------------------------------------------------------------


def test_MQTT_3_3_2_8_topic_alias_0_gets_0x94(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Publish("t", b"x", 0, properties=Properties(topic_alias=0)))
    disconnected_with(raw, 0x94)  # Topic Alias invalid (section 3.3.2.3.4)


def test_MQTT_3_3_2_9_topic_alias_above_maximum_gets_0x94(mesh: MeshInfo) -> None:
    raw, ack = connect(mesh.node(0))
    maximum = ack.properties.topic_alias_maximum or 0
    raw.send(Publish("t", b"x", 0, properties=Properties(topic_alias=maximum + 1)))
    disconnected_with(raw, 0x94)


def test_MQTT_3_3_2_12_aliases_up_to_the_maximum_are_accepted(mesh: MeshInfo) -> None:
    topic = uid("alias/in")
    sub = connected(mesh.node(1))
    subscribe(sub, Subscription(topic, 1))
    raw, ack = connect(mesh.node(0))
    top = ack.properties.topic_alias_maximum or 0
    publish_acked(raw, Publish(topic, b"1", 1, packet_id=1, properties=Properties(topic_alias=top)))
    publish_acked(raw, Publish("", b"2", 1, packet_id=2, properties=Properties(topic_alias=top)))
    got = [next_publish(sub), next_publish(sub)]
    assert [(p.topic, p.payload) for p in got] == [(topic, b"1"), (topic, b"2")]


def test_S3_3_2_3_4_unknown_topic_alias_is_a_protocol_error(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Publish("", b"x", 0, properties=Properties(topic_alias=1)))
    disconnected_with(raw, 0x82)


def test_MQTT_3_1_2_26_27_outbound_aliases_within_the_client_maximum(mesh: MeshInfo) -> None:
    topics = [uid("alias/out") for _ in range(3)]
    with_aliases = connected(mesh.node(0), props=Properties(topic_alias_maximum=1))
    without = connected(mesh.node(0))
    for raw in (with_aliases, without):
        subscribe(raw, *(Subscription(t, 0) for t in topics))
    pub = connected(mesh.node(0))
    for t in (*topics, topics[0]):
        publish_acked(pub, Publish(t, b"x", 1, packet_id=1))
    seen = [next_publish(with_aliases).properties.topic_alias for _ in range(4)]
    assert all(a in (None, 1) for a in seen) and 1 in seen  # [MQTT-3.1.2-26]
    assert all(next_publish(without).properties.topic_alias is None for _ in range(4))


# ---- subscriptions -------------------------------------------------------------------------


def test_MQTT_3_8_3_3_no_local(mesh: MeshInfo) -> None:
    topic, sentinel = uid("nl/t"), uid("nl/s")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription(topic, 1, no_local=True), Subscription(sentinel, 1))
    raw.send(Publish(topic, b"own", 1, packet_id=1))
    raw.send(Publish(sentinel, b"sentinel", 1, packet_id=2))
    got = [raw.recv() for _ in range(3)]  # two PUBACKs and one PUBLISH
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"sentinel"]
    other = connected(mesh.node(1))
    publish_acked(other, Publish(topic, b"theirs", 1, packet_id=1))
    assert next_publish(raw).payload == b"theirs"


def test_MQTT_3_8_3_4_no_local_on_a_shared_subscription_is_a_protocol_error(
    mesh: MeshInfo,
) -> None:
    raw = connected(mesh.node(0))
    raw.send(Subscribe(1, (Subscription("$share/g/t", 0, no_local=True),)))
    disconnected_with(raw, 0x82)


def test_MQTT_3_8_3_5_reserved_subscription_option_bits_are_malformed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("82 07 0001 00 0001 61 c1"))  # options 0xc1: reserved bits set
    disconnected_with(raw, 0x81)


def test_S3_8_3_1_retain_handling_3_is_a_protocol_error(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(bytes.fromhex("82 07 0001 00 0001 61 30"))
    disconnected_with(raw, 0x82)


def test_MQTT_3_8_4_3_identical_filter_replaces_the_subscription(mesh: MeshInfo) -> None:
    topic = uid("replace/t")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription(topic, 0))
    subscribe(raw, Subscription(topic, 1), pid=2)
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, b"once", 1, packet_id=1))
    got = next_publish(raw)
    assert got.qos == 1 and got.payload == b"once"  # one copy, at the new QoS
    publish_acked(pub, Publish(topic, b"twice", 1, packet_id=2))
    assert next_publish(raw).payload == b"twice"


def test_MQTT_3_9_3_1_suback_codes_in_filter_order(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    ack = subscribe(
        raw, Subscription("ok/a", 2), Subscription("bad/#/x", 1), Subscription("ok/b", 1)
    )
    assert ack.reason_codes == (2, 0x8F, 1)
    assert ack.properties.reason_string  # the refusal is explained


def test_MQTT_3_10_4_5_unsuback_even_when_nothing_was_subscribed(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    raw.send(Unsubscribe(7, ("never/subscribed",)))
    ack = raw.recv()
    assert isinstance(ack, UnsubAck) and ack.packet_id == 7  # [MQTT-3.10.4-4]
    assert ack.reason_codes == (0x11,)


def test_MQTT_4_7_2_1_wildcards_do_not_match_dollar_topics(mesh: MeshInfo) -> None:
    level = uid("dollar")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription("#", 0), Subscription("+/" + level, 0))
    pub = connected(mesh.node(0))
    publish_acked(pub, Publish(f"$app/{level}", b"hidden", 1, packet_id=1))
    publish_acked(pub, Publish(f"app/{level}", b"visible", 1, packet_id=2))
    while True:  # other tests publish too: skip their messages
        got = next_publish(raw)
        assert got.payload != b"hidden"
        if got.payload == b"visible":
            break


# ---- retained messages and retain options --------------------------------------------------


def _retain(mesh: MeshInfo, topic: str, payload: bytes) -> None:
    pub = connected(mesh.node(1))
    publish_acked(pub, Publish(topic, payload, 1, retain=True, packet_id=1))


def test_MQTT_3_3_1_9_retain_handling_0_sends_retained_on_every_subscribe(
    mesh: MeshInfo,
) -> None:
    topic = uid("rh0/t")
    _retain(mesh, topic, b"kept")
    raw = connected(mesh.node(0))
    for pid in (1, 2):
        subscribe(raw, Subscription(topic, 1, retain_handling=0), pid=pid)
        got = next_publish(raw)
        assert got.retain and got.payload == b"kept"


def test_MQTT_3_3_1_10_retain_handling_1_only_for_a_new_subscription(mesh: MeshInfo) -> None:
    topic = uid("rh1/t")
    _retain(mesh, topic, b"kept")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription(topic, 1, retain_handling=1))
    assert next_publish(raw).payload == b"kept"
    subscribe(raw, Subscription(topic, 1, retain_handling=1), pid=2)
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)  # no second copy


def test_MQTT_3_3_1_11_retain_handling_2_sends_no_retained(mesh: MeshInfo) -> None:
    topic = uid("rh2/t")
    _retain(mesh, topic, b"kept")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription(topic, 1, retain_handling=2))
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)


def test_MQTT_3_3_1_12_13_retain_as_published(mesh: MeshInfo) -> None:
    topic = uid("rap/t")
    keep = connected(mesh.node(0))
    subscribe(keep, Subscription(topic, 1, retain_as_published=True, retain_handling=2))
    clear = connected(mesh.node(0))
    subscribe(clear, Subscription(topic, 1, retain_handling=2))
    _retain(mesh, topic, b"live")
    assert next_publish(keep).retain  # [MQTT-3.3.1-13]
    assert not next_publish(clear).retain  # [MQTT-3.3.1-12]


def test_MQTT_3_3_1_6_7_empty_retained_payload_deletes(mesh: MeshInfo) -> None:
    topic = uid("rdel/t")
    _retain(mesh, topic, b"kept")
    _retain(mesh, topic, b"")
    raw = connected(mesh.node(0))
    subscribe(raw, Subscription(topic, 1))
    raw.send(PingReq())
    assert isinstance(raw.recv(), PingResp)  # nothing retained any more


# ---- message expiry ------------------------------------------------------------------------


def test_MQTT_3_3_2_5_6_message_expiry_in_a_queue(mesh: MeshInfo) -> None:
    cid, topic = uid("exp"), uid("exp/t")
    props = Properties(session_expiry_interval=300)
    sub = connected(mesh.node(0), cid, props=props)
    subscribe(sub, Subscription(topic, 1))
    sub.send(Disconnect())
    assert sub.closed()
    pub = connected(mesh.node(1))
    short = Properties(message_expiry_interval=1)
    publish_acked(pub, Publish(topic, b"short", 1, packet_id=1, properties=short))
    long = Properties(message_expiry_interval=120)
    publish_acked(pub, Publish(topic, b"long", 1, packet_id=2, properties=long))
    time.sleep(2.1)  # let the short one expire: the statement is about time passing
    again = connected(mesh.node(0), cid, clean_start=False, props=props)
    got = next_publish(again)
    assert got.payload == b"long"  # [MQTT-3.3.2-5] the expired one was deleted
    interval = got.properties.message_expiry_interval
    assert interval is not None and interval < 120  # [MQTT-3.3.2-6] the time left


# ---- receive maximum -----------------------------------------------------------------------


def test_MQTT_3_3_4_9_server_respects_the_client_receive_maximum(mesh: MeshInfo) -> None:
    topic = uid("rm/t")
    sub = connected(mesh.node(0), props=Properties(receive_maximum=2))
    subscribe(sub, Subscription(topic, 1))
    pub = connected(mesh.node(1))
    for i in range(4):
        publish_acked(pub, Publish(topic, str(i).encode(), 1, packet_id=i + 1))
    first = [next_publish(sub, ack=False), next_publish(sub, ack=False)]
    sub.send(PingReq())
    assert isinstance(sub.recv(), PingResp)  # [MQTT-3.3.4-10] PINGRESP is not held back
    sub.send(PubAck(first[0].packet_id or 0))
    assert next_publish(sub).payload == b"2"  # only after an ack freed the window


@pytest.mark.parametrize("qos", [1, 2])
def test_MQTT_3_3_4_7_client_over_our_receive_maximum_gets_0x93(mesh: MeshInfo, qos: int) -> None:
    raw, ack = connect(mesh.node(0))
    limit = ack.properties.receive_maximum or 65535
    # QoS 2 stays unacknowledged until PUBREL; QoS 1 until the router stored it, and the
    # whole burst reaches the node in one read, before any router answer.
    topic = uid("rmx")
    burst = b"".join(
        encode(Publish(topic, b"x", qos, packet_id=pid), 5) for pid in range(1, 2 * limit + 2)
    )
    raw.send(burst)
    while True:
        pkt = raw.recv()
        if isinstance(pkt, Disconnect):
            assert pkt.reason_code == 0x93
            break
        assert isinstance(pkt, PubAck | PubRec)
    assert raw.closed()


# ---- shared subscriptions ------------------------------------------------------------------


def test_S4_8_2_shared_subscription_delivers_each_message_to_one_member(mesh: MeshInfo) -> None:
    topic = uid("share/t")
    members = [connected(mesh.node(i % 2)) for i in range(2)]
    for m in members:
        subscribe(m, Subscription(f"$share/g/{topic}", 1))
    pub = connected(mesh.node(0))
    for i in range(10):
        publish_acked(pub, Publish(topic, str(i).encode(), 1, packet_id=i + 1))
    got: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        for m in members:
            try:
                pkt = m.recv(timeout=0.1)
            except TimeoutError:
                continue
            assert isinstance(pkt, Publish)
            m.send(PubAck(pkt.packet_id or 0))
            got.append(pkt.payload)
    assert sorted(got) == sorted(str(i).encode() for i in range(10))  # each exactly once


def test_S4_8_2_invalid_shared_filter_gets_0x8f(mesh: MeshInfo) -> None:
    raw = connected(mesh.node(0))
    ack = subscribe(raw, Subscription("$share/g", 0), Subscription("$share//t", 0))
    assert ack.reason_codes == (0x8F, 0x8F)
