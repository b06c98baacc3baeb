"""PUBLISH from the client: what is routed, the acks it gets, and the rules that close it."""

from __future__ import annotations

import pytest

from services.common.acl import Access, AclRule
from services.common.message import Message
from services.common.mqtt import (
    Disconnect,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    encode,
)
from services.connection.channel import ChannelConfig, Close, Route, State
from tests.connection.harness import connected, kinds, take, written


def test_consecutive_publishes_share_one_route_in_order() -> None:
    ch, dec = connected(4)
    data = b"".join(
        encode(Publish(f"t/{i}", b"%d" % i, i % 2, packet_id=i or None), 4) for i in range(4)
    )
    (route,) = ch.receive(data, 2.0)
    assert isinstance(route, Route)
    assert route.messages == [
        Message("t", "t/0", b"0", 0, False, "c", published_at=2.0),
        Message("t", "t/1", b"1", 1, False, "c", published_at=2.0),
        Message("t", "t/2", b"2", 0, False, "c", published_at=2.0),
        Message("t", "t/3", b"3", 1, False, "c", published_at=2.0),
    ]
    assert written(ch, dec) == [PubAck(1), PubAck(3)]


def test_qos0_publish_is_routed_without_an_answer() -> None:
    ch, _ = connected(5)
    (route,) = ch.receive(encode(Publish("a", b"x", retain=True), 5), 1.0)
    assert isinstance(route, Route) and route.messages[0].retain
    assert not ch.out


def test_message_properties_travel_and_expiry_becomes_a_deadline() -> None:
    ch, _ = connected(5)
    props = Properties(content_type="text/plain", message_expiry_interval=30)
    (route,) = ch.receive(encode(Publish("a", b"x", properties=props), 5), 100.0)
    assert isinstance(route, Route)
    (msg,) = route.messages
    assert msg.properties == Properties(content_type="text/plain")
    assert msg.expires_at == 130.0


def test_qos2_is_forwarded_once_and_completed_by_pubrel() -> None:
    ch, dec = connected(5)
    assert kinds(ch.receive(encode(Publish("a", b"x", 2, packet_id=9), 5), 1.0)) == ["Route"]
    resend = encode(Publish("a", b"x", 2, dup=True, packet_id=9), 5)
    assert ch.receive(resend, 1.0) == []  # [MQTT-4.3.3-10] answered, not forwarded again
    ch.receive(encode(PubRel(9), 5), 1.0)
    ch.receive(encode(PubRel(9), 5), 1.0)  # the id is free again: unknown now
    assert written(ch, dec) == [PubRec(9), PubRec(9), PubComp(9), PubComp(9, 0x92)]


def test_topic_alias_is_set_then_used() -> None:
    ch, _ = connected(5)
    set_alias = Publish("long/topic", b"1", properties=Properties(topic_alias=3))
    use_alias = Publish("", b"2", properties=Properties(topic_alias=3))
    (route,) = ch.receive(encode(set_alias, 5) + encode(use_alias, 5), 1.0)
    assert isinstance(route, Route)
    assert [m.topic for m in route.messages] == ["long/topic", "long/topic"]
    assert all(m.properties.topic_alias is None for m in route.messages)


@pytest.mark.parametrize(
    ("publish", "code"),
    [
        pytest.param(Publish("", b"x", properties=Properties(topic_alias=1)), 0x82, id="unknown"),
        pytest.param(
            Publish("a", b"x", properties=Properties(topic_alias=65)), 0x94, id="MQTT-3.3.2-9"
        ),
        pytest.param(Publish("a/+", b"x"), 0x90, id="wildcard-in-topic-name"),
    ],
)
def test_broken_publish_closes_with_its_reason(publish: Publish, code: int) -> None:
    ch, dec = connected(5)
    ok = encode(Publish("ok", b"1"), 5)
    actions = ch.receive(ok + encode(publish, 5) + ok, 1.0)
    assert kinds(actions) == ["Route", "Close"]  # what came before still counts, then nothing
    route = actions[0]
    assert isinstance(route, Route) and len(route.messages) == 1
    assert written(ch, dec) == [Disconnect(code)]
    assert ch.state is State.CLOSED


def test_v311_invalid_topic_closes_without_a_word() -> None:
    ch, _ = connected(4)
    assert ch.receive(encode(Publish("a/#", b"x"), 4), 1.0) == [
        Close(0x90, "topic name contains a wildcard")
    ]
    assert not ch.out


@pytest.mark.parametrize(("level", "ack"), [(5, PubAck(1, 0x87)), (4, PubAck(1))])
def test_publish_denied_by_acl_is_acked_but_not_routed(level: int, ack: PubAck) -> None:
    ch, dec = connected(level, acl=(AclRule(False, Access.PUBLISH, "secret/#"),))
    assert ch.receive(encode(Publish("secret/x", b"x", 1, packet_id=1), level), 1.0) == []
    assert written(ch, dec) == [ack]  # 3.1.1 cannot say no: acknowledged, then dropped


def test_payload_that_is_not_utf8_is_refused() -> None:
    ch, dec = connected(5)
    bad = Publish("a", b"\xff", 1, packet_id=4, properties=Properties(payload_format_indicator=1))
    assert ch.receive(encode(bad, 5), 1.0) == []
    assert written(ch, dec) == [PubAck(4, 0x99)]


def test_a_utf8_payload_may_hold_u0000() -> None:
    # Well-formed UTF-8 is all Payload Format Indicator 1 asks [MQTT-3.3.2-4]: the ban on
    # U+0000 is for UTF-8 Encoded Strings (topics, properties), not for payloads.
    ch, _ = connected(5)
    ok = Publish(
        "a", b'{"a":"x\x00y"}', 1, packet_id=4, properties=Properties(payload_format_indicator=1)
    )
    routed = ch.receive(encode(ok, 5), 1.0)
    assert [m.payload for r in routed if isinstance(r, Route) for m in r.messages] == [ok.payload]


def test_more_unreleased_qos2_than_receive_maximum_closes() -> None:
    ch, dec = connected(5, config=ChannelConfig(reason_strings=False, receive_maximum=2))
    data = b"".join(encode(Publish("a", b"x", 2, packet_id=i), 5) for i in (1, 2, 3))
    assert kinds(ch.receive(data, 1.0)) == ["Route", "Close"]
    assert written(ch, dec) == [PubRec(1), PubRec(2), Disconnect(0x93)]


def test_deferred_acks_wait_for_routing_and_keep_their_order() -> None:
    ch, dec = connected(5, config=ChannelConfig(reason_strings=False, defer_publish_acks=True))
    data = b"".join(encode(Publish("a", b"x", 1, packet_id=i), 5) for i in (1, 2))
    (route,) = ch.receive(data, 1.0)
    assert isinstance(route, Route)
    assert [m.packet_id for m in route.messages] == [1, 2]  # what the node acks with
    assert not ch.out
    ch.publish_routed(2)
    assert not ch.out  # [MQTT-4.6.0-2] PUBACK 1 must go first
    ch.publish_routed(1, 0x97)
    assert written(ch, dec) == [PubAck(1, 0x97), PubAck(2)]


def test_an_immediate_ack_waits_behind_a_deferred_one() -> None:
    ch, dec = connected(
        5,
        acl=(AclRule(False, Access.PUBLISH, "no"),),
        config=ChannelConfig(reason_strings=False, defer_publish_acks=True),
    )
    ch.receive(encode(Publish("a", b"x", 1, packet_id=1), 5), 1.0)
    ch.receive(encode(Publish("no", b"x", 1, packet_id=2), 5), 1.0)  # refused: ack is ready
    assert not ch.out
    ch.publish_routed(1)
    assert written(ch, dec) == [PubAck(1), PubAck(2, 0x87)]


def test_v311_gets_a_plain_ack_when_routing_reports_an_error() -> None:
    ch, dec = connected(4, config=ChannelConfig(reason_strings=False, defer_publish_acks=True))
    ch.receive(encode(Publish("a", b"x", 2, packet_id=5), 4), 1.0)
    ch.publish_routed(5, 0x97)
    assert take(ch) == bytes.fromhex("50 02 00 05")  # PUBREC without a reason code
    resend = encode(Publish("a", b"x", 2, dup=True, packet_id=5), 4)
    assert ch.receive(resend, 1.0) == []  # the client saw success: still exactly once
    ch.receive(encode(PubRel(5), 4), 1.0)
    assert written(ch, dec) == [PubRec(5), PubComp(5)]


def test_v5_refused_qos2_frees_its_packet_id() -> None:
    ch, dec = connected(5, config=ChannelConfig(reason_strings=False, defer_publish_acks=True))
    ch.receive(encode(Publish("a", b"x", 2, packet_id=5), 5), 1.0)
    ch.publish_routed(5, 0x97)
    assert written(ch, dec) == [PubRec(5, 0x97)]
    # [MQTT-4.3.3-9] after a refusing PUBREC the same id is a new message
    assert kinds(ch.receive(encode(Publish("a", b"y", 2, packet_id=5), 5), 1.0)) == ["Route"]


def test_routing_answer_after_close_writes_nothing() -> None:
    ch, _ = connected(5, config=ChannelConfig(reason_strings=False, defer_publish_acks=True))
    ch.receive(encode(Publish("a", b"x", 1, packet_id=1), 5), 1.0)
    ch.disconnect(0x8B, "shutting down")
    ch.out.clear()
    ch.publish_routed(1)
    assert not ch.out
