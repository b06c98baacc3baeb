"""Protocol behaviour at the wire: keep alive, topic aliases, receive maximum, bad input."""

from __future__ import annotations

import time

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from services.common.mqtt.encoder import encode
from services.common.mqtt.properties import Properties
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho, Raw


def test_keepalive_timeout_disconnects_with_0x8d(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    assert isinstance(raw.connect(Connect("ka-1", 5, keepalive_s=1)), ConnAck)
    started = time.monotonic()
    pkt = raw.recv(timeout=5)
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x8D
    assert raw.closed(timeout=2)
    assert time.monotonic() - started >= 1.4  # 1.5 x keep alive, not earlier


def test_pings_keep_a_connection_alive(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1), level=4)
    assert isinstance(raw.connect(Connect("ka-2", 4, keepalive_s=1)), ConnAck)
    for _ in range(4):
        time.sleep(0.6)
        raw.send(PingReq())
        assert isinstance(raw.recv(), PingResp)
    raw.close()


def test_inbound_topic_alias(mesh: MeshInfo) -> None:
    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe("alias/in", 1)
    raw = Raw(mesh.node(0))
    ack = raw.connect(Connect("alias-pub", 5))
    assert ack.properties.topic_alias_maximum  # type: ignore[union-attr]
    raw.send(Publish("alias/in", b"1", 1, packet_id=1, properties=Properties(topic_alias=3)))
    raw.send(Publish("", b"2", 1, packet_id=2, properties=Properties(topic_alias=3)))
    assert [type(raw.recv()), type(raw.recv())] == [PubAck, PubAck]
    assert [(m.topic, m.payload) for m in sub.expect(2)] == [("alias/in", b"1"), ("alias/in", b"2")]
    # An alias above our maximum is a protocol error: 0x94.
    raw.send(Publish("", b"3", 0, properties=Properties(topic_alias=60000)))
    pkt = raw.recv()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x94
    sub.close()


def test_outbound_topic_alias(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1))
    raw.connect(Connect("alias-sub", 5, properties=Properties(topic_alias_maximum=4)))
    raw.send(Subscribe(1, (Subscription("alias/out", 0),)))
    assert isinstance(raw.recv(), SubAck)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish("alias/out", "a")
    pub.publish("alias/out", "b")
    first, second = raw.recv(), raw.recv()
    assert isinstance(first, Publish) and isinstance(second, Publish)
    assert first.topic == "alias/out" and first.properties.topic_alias == 1
    assert second.topic == "" and second.properties.topic_alias == 1
    assert second.payload == b"b"
    pub.close()
    raw.close()


def test_receive_maximum_is_respected(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1))
    raw.connect(Connect("rm-sub", 5, properties=Properties(receive_maximum=2)))
    raw.send(Subscribe(1, (Subscription("rm/t", 1),)))
    assert isinstance(raw.recv(), SubAck)
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(5):
        pub.publish("rm/t", str(i), 1)
    got = [raw.recv(), raw.recv()]
    assert [p.payload for p in got] == [b"0", b"1"]  # type: ignore[union-attr]
    assert not raw.closed(timeout=0.5) and not raw.pending  # nothing more until acked
    raw.send(PubAck(got[0].packet_id))  # type: ignore[union-attr, arg-type]
    nxt = raw.recv()
    assert isinstance(nxt, Publish) and nxt.payload == b"2"
    pub.close()
    raw.close()


def test_malformed_packet_closes_only_that_connection(mesh: MeshInfo) -> None:
    sub = Paho(mesh.node(0))
    sub.connect()
    sub.subscribe("mal/ok", 1)
    bad = Raw(mesh.node(0))
    bad.connect(Connect("bad-client", 5))
    bad.send(bytes.fromhex("36 05 0001 61 0001"))  # PUBLISH with QoS 3 [MQTT-3.3.1-4]
    pkt = bad.recv()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x81
    assert bad.closed()
    bad311 = Raw(mesh.node(0), level=4)
    bad311.connect(Connect("bad-311", 4))
    bad311.send(bytes.fromhex("30 04 0002 c328"))  # invalid UTF-8 topic
    assert bad311.closed() and not bad311.pending  # 3.1.1: plain close
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish("mal/ok", "still fine", 1)
    assert sub.expect(1)[0].payload == b"still fine"
    sub.close()
    pub.close()


def test_first_packet_must_be_connect(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1))
    raw.send(PingReq())  # [MQTT-3.1.0-1]
    assert raw.closed()


def test_second_connect_is_a_protocol_error(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(1))
    raw.connect(Connect("twice", 5))
    raw.send(Connect("twice", 5))  # [MQTT-3.1.0-2]
    pkt = raw.recv()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x82


def test_unsupported_protocol_version_gets_return_code_1(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0), level=4)  # the answer is in the 3.1.1 format
    raw.send(bytes.fromhex("10 0c 0004 4d515454 07 02 003c 0000"))
    pkt = raw.recv()
    assert isinstance(pkt, ConnAck) and pkt.reason_code == 0x84  # return code 1
    assert raw.closed()


def test_invalid_topic_name_on_publish_gets_0x90(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    raw.connect(Connect("bad-topic", 5))
    raw.send(Publish("a/+/b", b"x", 1, packet_id=1))
    pkt = raw.recv()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x90


def test_packet_too_large_gets_0x95(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    ack = raw.connect(Connect("too-big", 5))
    limit = ack.properties.maximum_packet_size  # type: ignore[union-attr]
    # Only the start of it: the node refuses on the length in the fixed header, and closes
    # while a client still sending the rest would get a reset.
    raw.send(encode(Publish("big", b"x" * (limit + 10), 0), 5)[:1024])
    pkt = raw.recv()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x95


def test_assigned_client_identifier(mesh: MeshInfo) -> None:
    raw = Raw(mesh.node(0))
    ack = raw.connect(Connect("", 5))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.properties.assigned_client_identifier  # [MQTT-3.2.2-16]
    raw311 = Raw(mesh.node(0), level=4)
    refused = raw311.connect(Connect("", 4, clean_start=False))
    assert isinstance(refused, ConnAck) and refused.reason_code == 0x85  # rc 2 [MQTT-3.1.3-8]


def test_message_expiry_is_forwarded_and_properties_pass_through(mesh: MeshInfo) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as PahoProps

    sub = Paho(mesh.node(1))
    sub.connect()
    sub.subscribe("props/t", 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 60
    props.ResponseTopic = "reply/here"
    props.CorrelationData = b"corr"
    props.ContentType = "text/plain"
    props.PayloadFormatIndicator = 1
    props.UserProperty = [("k", "v"), ("k", "w")]
    pub.publish("props/t", "body", 1, props=props)
    (m,) = sub.expect(1)
    p = m.properties
    assert 55 <= p.MessageExpiryInterval <= 60
    assert (p.ResponseTopic, p.CorrelationData, p.ContentType) == (
        "reply/here",
        b"corr",
        "text/plain",
    )
    assert p.UserProperty == [("k", "v"), ("k", "w")]
    sub.close()
    pub.close()
