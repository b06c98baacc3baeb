"""PINGREQ, the client's DISCONNECT, server-initiated close, keep alive, CONNECT timeout and
broken input."""

from __future__ import annotations

import pytest

from services.common.connect import ConnectOutcome
from services.common.mqtt import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    Properties,
    Will,
    encode,
)
from services.connection.channel import ChannelConfig, Close, State
from tests.connection.harness import connected, kinds, new_channel, take, written


def test_pingreq_gets_pingresp() -> None:
    ch, _ = connected(4)
    assert ch.receive(encode(PingReq(), 4), 1.0) == []
    assert take(ch) == bytes.fromhex("d0 00")


def test_normal_disconnect_discards_the_will() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 4, will=Will("w", b"x")), 4), 0.0)
    ch.authenticated(ConnectOutcome(), 0.0)
    assert ch.will == Will("w", b"x")
    assert ch.receive(encode(Disconnect(), 4), 1.0) == [Close(0, "client disconnected")]
    assert ch.will is None and ch.normal_disconnect  # [MQTT-3.14.4-3]
    assert ch.state is State.CLOSED


def test_disconnect_with_will_keeps_it_and_may_change_the_session_expiry() -> None:
    ch = new_channel()
    asked = Properties(session_expiry_interval=60)
    ch.receive(encode(Connect("c", 5, will=Will("w", b"x"), properties=asked), 5), 0.0)
    ch.authenticated(ConnectOutcome(session_expiry_s=60), 0.0)
    bye = Disconnect(0x04, Properties(session_expiry_interval=5))
    assert ch.receive(encode(bye, 5), 1.0) == [Close(0x04, "client disconnected")]
    assert ch.will is not None and not ch.normal_disconnect
    assert ch.disconnect_expiry_s == 5


def test_session_expiry_on_disconnect_after_zero_is_a_protocol_error() -> None:
    ch, dec = connected(5)  # CONNECT without a session expiry: 0
    bye = Disconnect(0, Properties(session_expiry_interval=5))
    assert kinds(ch.receive(encode(bye, 5), 1.0)) == ["Close"]  # [MQTT-3.14.2-2]
    assert written(ch, dec) == [Disconnect(0x82)]


@pytest.mark.parametrize(("level", "raw"), [(5, "e0 01 8d"), (4, "")])
def test_keep_alive_closes_a_silent_client(level: int, raw: str) -> None:
    ch, _ = connected(level, keepalive_s=10)
    ch.receive(encode(PingReq(), level), 4.0)  # anything heard resets the clock
    ch.out.clear()
    assert ch.tick(19.0) == []
    assert ch.tick(19.1) == [Close(0x8D, "keep alive timeout")]  # [MQTT-3.1.2-24] 1.5 x 10 s
    assert take(ch) == bytes.fromhex(raw)
    assert ch.tick(100.0) == []  # closed once


def test_keep_alive_zero_never_times_out() -> None:
    ch, _ = connected(4, keepalive_s=0)
    assert ch.tick(1e9) == [] and ch.state is State.CONNECTED


def test_connect_timeout() -> None:
    ch = new_channel(ChannelConfig(connect_timeout_s=2), now=0.0)
    assert ch.tick(2.0) == []
    assert ch.tick(2.5) == [Close(0xA0, "no CONNECT in time")]
    assert not ch.out and ch.state is State.CLOSED


def test_server_disconnect_tells_an_mqtt5_client_why_once() -> None:
    ch, dec = connected(5)
    assert ch.disconnect(0x8B, "server shutting down") == [Close(0x8B, "server shutting down")]
    assert written(ch, dec) == [Disconnect(0x8B)]
    assert ch.disconnect(0x8B, "again") == []
    assert ch.receive(encode(PingReq(), 5), 1.0) == [] and not ch.out


def test_server_disconnect_before_connack_answers_with_connack() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    assert kinds(ch.disconnect(0x8E, "taken over")) == ["Close"]
    assert take(ch) == encode(ConnAck(False, 0x8E), 5)


@pytest.mark.parametrize(
    "packet", [pytest.param(Auth(), id="auth"), pytest.param(Connect("c", 5), id="second-connect")]
)
def test_unexpected_packets_are_protocol_errors(packet: Auth | Connect) -> None:
    ch, dec = connected(5)
    assert kinds(ch.receive(encode(packet, 5), 1.0)) == ["Close"]
    assert written(ch, dec) == [Disconnect(0x82)]


def test_malformed_bytes_close_after_the_packets_before_them() -> None:
    ch, _ = connected(5)
    actions = ch.receive(encode(PingReq(), 5) + bytes.fromhex("c1 00"), 1.0)  # bad flags
    (close,) = actions
    assert isinstance(close, Close) and close.reason_code == 0x81  # malformed packet
    assert take(ch) == bytes.fromhex("d0 00") + encode(Disconnect(0x81), 5)


def test_control_packets_past_the_burst_and_rate_get_0x96() -> None:
    config = ChannelConfig(control_packets_per_s=10, control_packets_burst=20)
    ch, dec = connected(5, config=config)
    # The burst, then 10 more over the next second: all answered.
    assert ch.receive(encode(PingReq(), 5) * 20, 1.0) == []
    for i in range(1, 11):  # one token every 0.1 s
        assert ch.receive(encode(PingReq(), 5), 1.001 + i * 0.1) == []
    (close,) = ch.receive(encode(PingReq(), 5) * 5, 2.002)  # one too many: the rest unread
    assert isinstance(close, Close) and close.reason_code == 0x96
    got = written(ch, dec)
    assert got[-1] == Disconnect(0x96, got[-1].properties) and len(got) == 31


def test_acks_of_deliveries_under_way_cost_nothing() -> None:
    from services.common.message import Message
    from services.common.mqtt import PubAck

    config = ChannelConfig(control_packets_per_s=1, control_packets_burst=5)
    ch, _ = connected(5, config=config)
    for _ in range(300):
        ch.outbound.deliver(Message("t", "a", b"x", 1, False), 1, False, (), 1.0)
    take(ch)
    acks = b"".join(encode(PubAck(pid), 5) for pid in list(ch.outbound.inflight))
    assert len(acks) == 300 * 4
    assert ch.receive(acks, 1.0) == [] and ch.state is State.CONNECTED
    assert not ch.outbound.inflight
    # Acks of ids nobody sent: the budget (5) applies.
    (close,) = ch.receive(encode(PubAck(77), 5) * 6, 1.0)
    assert isinstance(close, Close) and close.reason_code == 0x96


def test_a_repeated_ack_of_a_delivery_under_way_costs_a_token() -> None:
    from services.common.message import Message
    from services.common.mqtt import PubRec

    config = ChannelConfig(control_packets_per_s=1, control_packets_burst=5)
    ch, _ = connected(5, config=config)
    ch.outbound.deliver(Message("t", "a", b"x", 1, False), 1, False, (), 1.0)
    (pid,) = ch.outbound.inflight
    # PUBRECs of a QoS 1 delivery (it awaits PUBACK): each answered PUBREL 0x92, none free.
    (close,) = ch.receive(encode(PubRec(pid), 5) * 6, 1.0)
    assert isinstance(close, Close) and close.reason_code == 0x96


def test_a_wall_clock_stepped_back_does_not_empty_the_budget() -> None:
    config = ChannelConfig(control_packets_per_s=10, control_packets_burst=20)
    ch, _ = connected(5, config=config)
    assert ch.receive(encode(PingReq(), 5), 1000.0) == []
    assert ch.receive(encode(PingReq(), 5), 970.0) == []  # 30 s back: still answered
    assert ch.state is State.CONNECTED
