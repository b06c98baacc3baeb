"""CONNECT, the session service's outcome, CONNACK, and the packets held in between."""

from __future__ import annotations

import pytest

from services.common.connect import ConnectOutcome
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Packet,
    Properties,
    PubAck,
    Publish,
    Subscription,
    Will,
    encode,
)
from services.connection.channel import Authenticate, ChannelConfig, Close, Route, State
from tests.connection.harness import ASSIGNED_ID, kinds, new_channel, take


def test_connect_asks_the_session_service_then_connack_accepts() -> None:
    ch = new_channel()
    connect = Connect("dev-1", 4, username="u")
    assert ch.receive(encode(connect, 4), 0.0) == [Authenticate(connect, "dev-1")]
    assert not ch.out  # no CONNACK before the outcome
    outcome = ConnectOutcome(tenant="t", epoch=7, session_present=True, incarnation=3)
    assert ch.authenticated(outcome, 0.0) == []
    assert take(ch) == encode(ConnAck(True, 0), 4)
    identity = (ch.client_id, ch.username, ch.tenant, ch.epoch, ch.incarnation)
    assert identity == ("dev-1", "u", "t", 7, 3)
    # A resumed session delivers its queue even when its expiry is now 0 [MQTT-3.1.2-4].
    assert ch.state is State.CONNECTED and ch.persistent


def test_a_new_session_with_expiry_0_is_not_persistent() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("dev-2", 5), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    assert ch.state is State.CONNECTED and not ch.persistent


def test_v5_connack_announces_limits_and_the_assigned_client_id() -> None:
    cfg = ChannelConfig(
        reason_strings=False, receive_maximum=10, topic_alias_maximum=5, max_packet_size_bytes=4096
    )
    ch = new_channel(cfg)
    (auth,) = ch.receive(encode(Connect("", 5), 5), 0.0)  # [MQTT-3.1.3-6] empty id: assigned
    assert auth == Authenticate(Connect("", 5), ASSIGNED_ID)
    ch.authenticated(ConnectOutcome(tenant="t", session_expiry_s=60), 0.0)
    props = Properties(
        assigned_client_identifier=ASSIGNED_ID,
        receive_maximum=10,
        topic_alias_maximum=5,
        maximum_packet_size=4096,
        session_expiry_interval=60,  # differs from the 0 the client asked for
    )
    assert take(ch) == encode(ConnAck(False, 0, props), 5)
    assert ch.client_id == ASSIGNED_ID and ch.persistent and ch.session_expiry_s == 60


def test_v5_connack_omits_the_session_expiry_the_client_asked_for() -> None:
    ch = new_channel()
    asked = Properties(session_expiry_interval=60)
    ch.receive(encode(Connect("c", 5, properties=asked), 5), 0.0)
    ch.authenticated(ConnectOutcome(session_expiry_s=60), 0.0)
    (ack,) = _decode(take(ch), 5)
    assert isinstance(ack, ConnAck) and ack.properties.session_expiry_interval is None


def test_server_keep_alive_caps_what_the_client_asked() -> None:
    ch = new_channel(ChannelConfig(reason_strings=False, max_keepalive_s=30))
    ch.receive(encode(Connect("c", 5, keepalive_s=0), 5), 0.0)
    ch.authenticated(ConnectOutcome(), 0.0)
    (ack,) = _decode(take(ch), 5)
    assert isinstance(ack, ConnAck) and ack.properties.server_keep_alive == 30
    assert ch.tick(45.0) == []
    assert kinds(ch.tick(45.1)) == ["Close"]  # 1.5 x the imposed 30 s


_NOT_UTF8_WILL = Will("a", b"\xff", properties=Properties(payload_format_indicator=1))


@pytest.mark.parametrize(
    ("connect", "connack"),
    [
        pytest.param(Connect("", 4, clean_start=False), "20 02 00 02", id="MQTT-3.1.3-8"),
        pytest.param(Connect("", 3, "MQIsdp"), "20 02 00 02", id="v31-empty-client-id"),
        pytest.param(Connect("x" * 300, 4), "20 02 00 02", id="v4-client-id-too-long"),
        pytest.param(Connect("x" * 300, 5), "20 03 00 85 00", id="v5-client-id-too-long"),
        pytest.param(Connect("c", 5, will=Will("a/+", b"x")), "20 03 00 90 00", id="will-topic"),
        pytest.param(Connect("c", 5, will=_NOT_UTF8_WILL), "20 03 00 99 00", id="will-payload"),
    ],
)
def test_connect_refused_by_the_channel(connect: Connect, connack: str) -> None:
    ch = new_channel()
    (close,) = ch.receive(encode(connect, connect.protocol_level), 0.0)
    assert take(ch) == bytes.fromhex(connack)
    assert isinstance(close, Close) and ch.state is State.CLOSED


def test_a_will_response_topic_with_a_wildcard_closes_as_a_protocol_error() -> None:
    # [MQTT-3.3.2-14]; like any CONNECT the decoder refuses, closed without a CONNACK.
    will = Will("a", b"x", properties=Properties(response_topic="r/#"))
    ch = new_channel()
    (close,) = ch.receive(encode(Connect("c", 5, will=will), 5), 0.0)
    assert isinstance(close, Close) and close.reason_code == 0x82
    assert take(ch) == b"" and ch.state is State.CLOSED


def test_a_will_payload_may_hold_u0000() -> None:
    will = Will("a", b"x\x00y", properties=Properties(payload_format_indicator=1))
    ch = new_channel()
    assert kinds(ch.receive(encode(Connect("c", 5, will=will), 5), 0.0)) == ["Authenticate"]


@pytest.mark.parametrize(("level", "raw"), [(5, "20 03 00 87 00"), (4, "20 02 00 05")])
def test_refused_by_the_session_service(level: int, raw: str) -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", level, will=Will("w", b"x")), level), 0.0)
    assert ch.authenticated(ConnectOutcome(reason_code=0x87), 0.0) == [
        Close(0x87, "not authorized")
    ]
    assert take(ch) == bytes.fromhex(raw)
    assert ch.will is None and ch.state is State.CLOSED


def test_first_packet_must_be_connect() -> None:
    ch = new_channel()
    actions = ch.receive(encode(Publish("a", b"x"), 4), 0.0)
    assert actions == [Close(0x82, "first packet must be CONNECT")]  # [MQTT-3.1.0-1]
    assert not ch.out


def test_unsupported_protocol_level_gets_return_code_1() -> None:
    ch = new_channel()
    raw = bytes.fromhex("10 0c 0004 4d515454 07 02 003c 0000")  # CONNECT at level 7
    assert kinds(ch.receive(raw, 0.0)) == ["Close"]
    assert take(ch) == bytes.fromhex("20 02 00 01")  # [MQTT-3.1.2-2]


def test_packets_before_connack_are_held_and_replayed_in_order() -> None:
    ch = new_channel()
    data = encode(Connect("c", 5), 5) + encode(Publish("a", b"1", 1, packet_id=1), 5)
    assert kinds(ch.receive(data, 0.0)) == ["Authenticate"]
    assert kinds(ch.receive(encode(Publish("b", b"2"), 5), 0.0)) == []
    (route,) = ch.authenticated(ConnectOutcome(tenant="t"), 0.0)
    assert isinstance(route, Route)
    assert [(m.topic, m.payload, m.tenant) for m in route.messages] == [
        ("a", b"1", "t"),
        ("b", b"2", "t"),
    ]
    acked = _decode(take(ch), 5)
    assert [type(p) for p in acked] == [ConnAck, PubAck]


def test_too_many_packets_before_connack_close_the_connection() -> None:
    ch = new_channel(ChannelConfig(reason_strings=False, max_held_packets=2))
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    ping = bytes.fromhex("c000")
    assert ch.receive(ping * 2, 0.0) == []
    assert kinds(ch.receive(ping, 0.0)) == ["Close"]
    assert take(ch) == encode(ConnAck(False, 0x82), 5)  # no session yet: CONNACK says why


def test_bytes_held_before_connack_are_bounded_by_the_connect_limit() -> None:
    # 40 publishes of 2 KiB fit one pre-CONNACK limit of 64 KiB; 40 more do not.
    ch = new_channel(ChannelConfig(reason_strings=False, max_connect_packet_size_bytes=65536))
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    chunk = encode(Publish("a", b"x" * 2048), 5)
    assert ch.receive(chunk * 30, 0.0) == []
    assert kinds(ch.receive(chunk * 10, 0.0)) == ["Close"]
    assert take(ch) == encode(ConnAck(False, 0x82), 5)


def test_a_resumed_session_restores_its_subscriptions() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 5, clean_start=False), 5), 0.0)
    subs = ((Subscription("a/#", 1), 4), (Subscription("b", 0), None))
    ch.authenticated(ConnectOutcome(session_present=True, subscriptions=subs), 0.0)
    assert ch.subscriptions == {"a/#": 4, "b": None}


def test_an_outcome_after_close_does_nothing() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    ch.connection_lost()
    assert ch.authenticated(ConnectOutcome(), 0.0) == []
    assert not ch.out and ch.state is State.CLOSED


def _decode(data: bytes, level: int) -> list[Packet]:
    return Decoder(level).feed(data)
