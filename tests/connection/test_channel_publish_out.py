"""Deliveries to the client: framing, aliases, window, queue bound, expiry, size limit, and
the client's acks of them."""

from __future__ import annotations

import pytest

from services.common.message import Message
from services.common.mqtt import (
    Disconnect,
    PingReq,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    encode,
)
from services.connection.channel import Channel, ChannelConfig, Close, DeliveryProgress
from tests.connection.harness import connected, new_channel, take, written


def _msg(topic: str = "a/b", payload: bytes = b"hello", **kw: object) -> Message:
    return Message("t", topic, payload, 1, False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("retain", [False, True])
def test_delivery_bytes_equal_the_encoded_publish(level: int, qos: int, retain: bool) -> None:
    ch, _ = connected(level)
    ch.deliver(_msg(payload=b"p" * 200), qos, retain, (), 1.0)  # 2-byte remaining length
    pid = 1 if qos else None
    assert take(ch) == encode(Publish("a/b", b"p" * 200, qos, retain, False, pid), level)


def test_v5_delivery_carries_expiry_left_and_subscription_ids() -> None:
    ch, _ = connected(5)
    msg = _msg(properties=Properties(content_type="c"), expires_at=10.5)
    ch.deliver(msg, 1, False, (3, 7), 6.0)
    props = Properties(content_type="c", message_expiry_interval=5, subscription_identifier=(3, 7))
    assert take(ch) == encode(Publish("a/b", b"hello", 1, packet_id=1, properties=props), 5)


def test_v311_delivery_has_no_properties() -> None:
    ch, _ = connected(4)
    ch.deliver(_msg(properties=Properties(content_type="c"), expires_at=10.0), 0, False, (3,), 1.0)
    assert take(ch) == encode(Publish("a/b", b"hello"), 4)


def _alias_client(alias_max: int, max_packet: int | None = None) -> Channel:
    props = Properties(topic_alias_maximum=alias_max, maximum_packet_size=max_packet)
    ch, _ = connected(5, connect_props=props)
    return ch


def test_topics_get_aliases_up_to_the_clients_maximum() -> None:
    ch = _alias_client(1)
    for topic in ("a/b", "a/b", "c"):
        ch.deliver(_msg(topic), 0, False, (), 1.0)
    assert take(ch) == (
        encode(Publish("a/b", b"hello", properties=Properties(topic_alias=1)), 5)
        + encode(Publish("", b"hello", properties=Properties(topic_alias=1)), 5)
        + encode(Publish("c", b"hello"), 5)  # no alias left: the full topic
    )


def test_aliases_towards_a_client_stop_at_the_nodes_own_maximum() -> None:
    # The client allows 65,535; each alias holds a topic in the node's memory.
    config = ChannelConfig(outbound_topic_alias_maximum=2)
    ch, _ = connected(5, config=config, connect_props=Properties(topic_alias_maximum=65535))
    for topic in ("a", "b", "c", "a"):
        ch.deliver(_msg(topic), 0, False, (), 1.0)
    assert take(ch) == (
        encode(Publish("a", b"hello", properties=Properties(topic_alias=1)), 5)
        + encode(Publish("b", b"hello", properties=Properties(topic_alias=2)), 5)
        + encode(Publish("c", b"hello"), 5)  # past the node's 2: the full topic
        + encode(Publish("", b"hello", properties=Properties(topic_alias=1)), 5)
    )


def test_too_large_delivery_is_dropped_and_sets_no_alias() -> None:
    ch = _alias_client(4, max_packet=64)
    ch.deliver(_msg("big", b"x" * 100), 0, False, (), 1.0)
    assert not ch.out and ch.outbound.dropped == 1  # [MQTT-3.1.2-25] discarded as if sent
    ch.deliver(_msg("big", b"x"), 0, False, (), 1.0)
    # The client never saw the dropped packet: the alias is defined by this one.
    assert take(ch) == encode(Publish("big", b"x", properties=Properties(topic_alias=1)), 5)


def test_window_holds_further_deliveries_until_acked() -> None:
    ch, dec = connected(5, connect_props=Properties(receive_maximum=1))
    for i in range(3):
        ch.deliver(_msg(payload=b"%d" % i), 1, False, (), 1.0)
    assert written(ch, dec) == [Publish("a/b", b"0", 1, packet_id=1)]  # [MQTT-3.3.4-9]
    assert ch.outbound.free_window == 0 and ch.outbound.pending is not None
    assert ch.receive(encode(PubAck(1), 5), 1.0) == []
    assert written(ch, dec) == [Publish("a/b", b"1", 1, packet_id=2)]


def test_qos2_delivery_flow_frees_the_window_at_pubcomp() -> None:
    ch, dec = connected(5, connect_props=Properties(receive_maximum=1))
    ch.deliver(_msg(payload=b"0"), 2, False, (), 1.0)
    ch.deliver(_msg(payload=b"1"), 2, False, (), 1.0)
    assert written(ch, dec) == [Publish("a/b", b"0", 2, packet_id=1)]
    ch.receive(encode(PubRec(1), 5), 1.0)
    assert written(ch, dec) == [PubRel(1)]
    ch.receive(encode(PubComp(1), 5), 1.0)
    assert written(ch, dec) == [Publish("a/b", b"1", 2, packet_id=2)]


def test_pubrec_with_an_error_ends_the_delivery_without_pubrel() -> None:
    ch, dec = connected(5, connect_props=Properties(receive_maximum=1))
    ch.deliver(_msg(payload=b"0"), 2, False, (), 1.0)
    ch.deliver(_msg(payload=b"1"), 2, False, (), 1.0)
    written(ch, dec)
    ch.receive(encode(PubRec(1, 0x80), 5), 1.0)
    assert written(ch, dec) == [Publish("a/b", b"1", 2, packet_id=2)]


def test_pubrec_for_an_unknown_id_is_answered_not_found() -> None:
    ch, dec = connected(5)
    ch.receive(encode(PubRec(42), 5), 1.0)
    assert written(ch, dec) == [PubRel(42, 0x92)]


def test_pending_queue_is_bounded() -> None:
    cfg = ChannelConfig(max_queued_messages=1)
    ch, _ = connected(5, config=cfg, connect_props=Properties(receive_maximum=1))
    for _ in range(3):
        ch.deliver(_msg(), 1, False, (), 1.0)
    ob = ch.outbound
    assert (ob.sent, len(ob.pending or ()), ob.dropped) == (1, 1, 1)


def test_expired_messages_are_not_delivered_sent_or_queued() -> None:
    ch, dec = connected(5, connect_props=Properties(receive_maximum=1))
    ch.deliver(_msg(payload=b"old", expires_at=5.0), 1, False, (), 6.0)
    assert not ch.out and ch.outbound.expired == 1
    ch.deliver(_msg(payload=b"0"), 1, False, (), 6.0)
    ch.deliver(_msg(payload=b"soon", expires_at=7.0), 1, False, (), 6.0)  # queued
    written(ch, dec)
    ch.receive(encode(PubAck(1), 5), 8.0)  # it expired while it waited
    assert not ch.out and ch.outbound.expired == 2


def test_qos0_is_dropped_while_the_transport_is_congested() -> None:
    ch, _ = connected(4)
    ch.outbound.set_congested(True, 1.0)
    ch.deliver(_msg(), 0, False, (), 1.0)
    assert not ch.out and ch.outbound.dropped == 1


def test_qos1_waits_while_congested_and_goes_out_when_the_transport_drains() -> None:
    ch, dec = connected(5)
    ch.outbound.set_congested(True, 1.0)
    for i in range(3):
        ch.deliver(_msg(payload=b"%d" % i), 1, False, (), 1.0)
    assert not ch.out and ch.outbound.pending_bytes == 3 * len("a/b0")
    ch.outbound.set_congested(False, 2.0)
    assert [p.payload for p in written(ch, dec)] == [b"0", b"1", b"2"]  # type: ignore[union-attr]
    assert ch.outbound.pending_bytes == 0


def test_queued_bytes_are_bounded_too() -> None:
    ch, _ = connected(5, config=ChannelConfig(max_queued_bytes=2500))
    ch.outbound.set_congested(True, 1.0)
    for _ in range(3):
        ch.deliver(_msg(payload=b"x" * 1000), 1, False, (), 1.0)
    ob = ch.outbound
    assert (len(ob.pending or ()), ob.dropped) == (2, 1)


def test_queued_bytes_count_properties_too() -> None:
    # A small payload with large user properties is what it costs, not what its payload is.
    ch, _ = connected(5, config=ChannelConfig(max_queued_bytes=50_000))
    ch.outbound.set_congested(True, 1.0)
    heavy = Properties(user_property=(("k", "v" * 20_000),))
    for _ in range(3):
        ch.deliver(_msg(payload=b"x", properties=heavy), 1, False, (), 1.0)
    ob = ch.outbound
    assert (len(ob.pending or ()), ob.dropped) == (2, 1)
    assert ob.pending_bytes > 40_000
    ob.set_congested(False, 2.0)
    assert ob.pending_bytes == 0


@pytest.mark.parametrize("level", [4, 5])
def test_a_client_that_stays_congested_is_disconnected_with_0x97(level: int) -> None:
    cfg = ChannelConfig(slow_consumer_timeout_s=30.0, reason_strings=False)
    ch, dec = connected(level, config=cfg, keepalive_s=0)
    ch.outbound.set_congested(True, 100.0)
    ch.receive(encode(PingReq(), level), 120.0)  # it still talks, but does not read
    written(ch, dec)
    assert ch.tick(125.0) == []
    ch.outbound.set_congested(False, 126.0)
    ch.outbound.set_congested(True, 127.0)  # a fresh episode starts the clock again
    assert ch.tick(150.0) == []
    actions = ch.tick(158.0)
    assert isinstance(actions[0], Close) and actions[0].reason_code == 0x97
    if level == 5:
        assert written(ch, dec) == [Disconnect(0x97)]


def test_acks_of_a_persistent_session_report_progress_once_per_call() -> None:
    ch, _ = connected(5)
    ob = ch.outbound
    ob.track_completions()
    for pid, qos in ((10, 1), (11, 1), (12, 2)):
        assert ob.deliver_stored(_msg(), qos, False, (), pid, False, 1.0)
    acks = encode(PubAck(10), 5) + encode(PubAck(11), 5) + encode(PubRec(12), 5)
    assert ch.receive(acks, 1.0) == [DeliveryProgress()]
    assert ob.take_progress() == ([10, 11], [12])
    assert ch.receive(encode(PubAck(99), 5), 1.0) == []  # unknown: nothing recorded


def test_progress_is_reported_before_the_close_that_followed_the_acks() -> None:
    ch, _ = connected(5)
    ch.outbound.track_completions()
    ch.outbound.deliver_stored(_msg(), 1, False, (), 10, False, 1.0)
    actions = ch.receive(encode(PubAck(10), 5) + encode(Disconnect(), 5), 1.0)
    assert actions == [DeliveryProgress(), Close(0, "client disconnected")]
    assert ch.outbound.take_progress() == ([10], [])


def test_acks_without_tracking_report_nothing() -> None:
    ch, _ = connected(5)
    ch.deliver(_msg(), 1, False, (), 1.0)
    assert ch.receive(encode(PubAck(1), 5), 1.0) == []
    assert ch.outbound.take_progress() == ([], []) and ch.outbound.free_window == 65535


def test_stored_delivery_keeps_its_packet_id_and_dup_flag() -> None:
    ch, _ = connected(4)
    assert ch.outbound.deliver_stored(_msg(), 1, False, (), 77, True, 1.0)
    assert take(ch) == encode(Publish("a/b", b"hello", 1, False, True, 77), 4)
    ch.outbound.resend_pubrel(78)
    assert take(ch) == encode(PubRel(78), 4)


def test_unacked_shared_deliveries_can_be_handed_on() -> None:
    ch, _ = connected(5, connect_props=Properties(receive_maximum=1))
    ch.outbound.deliver(_msg(), 1, False, (), 1.0, origin="first")
    ch.outbound.deliver(_msg(), 1, False, (), 1.0, origin="queued")
    assert ch.outbound.unacked_shared() == ["first", "queued"]
    ch.receive(encode(PubAck(1), 5), 1.0)
    assert ch.outbound.unacked_shared() == ["queued"]  # now sent, still unacked


def test_a_persistent_sessions_shared_qos2_delivery_gets_its_pubrel_at_once() -> None:
    # A shared delivery is no entry of the session's queue: no released mark to wait for.
    # (It used to wait for one that never came: no PUBREL, and its slot of the window held.)
    ch, dec = connected(5, connect_props=Properties(receive_maximum=1))
    ob = ch.outbound
    ob.track_completions()
    ob.deliver(_msg(), 2, False, (), 1.0, origin="first")
    ob.deliver(_msg(payload=b"next"), 2, False, (), 1.0, origin="second")
    (first,) = written(ch, dec)
    assert isinstance(first, Publish) and first.packet_id is not None
    pid = first.packet_id
    ch.receive(encode(PubRec(pid), 5), 1.0)
    assert written(ch, dec) == [PubRel(pid)]
    assert ob.unacked_shared() == ["second"]  # queued behind the window of 1
    ch.receive(encode(PubComp(pid), 5), 1.0)
    (second,) = written(ch, dec)  # the window's slot came free
    assert isinstance(second, Publish) and second.payload == b"next"


def test_nothing_is_delivered_before_connack_or_after_close() -> None:
    ch = new_channel()
    ch.deliver(_msg(), 0, False, (), 1.0)
    assert not ch.out
    ch, _ = connected(4)
    ch.connection_lost()
    ch.deliver(_msg(), 0, False, (), 1.0)
    assert not ch.out


def test_a_persistent_sessions_pubrel_waits_for_send_pubrel() -> None:
    ch, _ = connected(5)
    ob = ch.outbound
    ob.track_completions()
    assert ob.deliver_stored(_msg(), 2, False, (), 12, False, 1.0)
    take(ch)
    assert ch.receive(encode(PubRec(12), 5), 1.0) == [DeliveryProgress()]
    assert take(ch) == b""  # the queue's released mark is not durable yet
    assert ch.receive(encode(PubRec(12), 5), 1.0) == []  # a repeat: still nothing written
    assert take(ch) == b""
    ob.send_pubrel(12)
    assert take(ch) == encode(PubRel(12), 5)
    ob.send_pubrel(12)  # only once
    assert take(ch) == b""
    assert ch.receive(encode(PubComp(12), 5), 1.0) == [DeliveryProgress()]
    assert ob.take_progress() == ([12], [12]) and ob.inflight == {}
