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
