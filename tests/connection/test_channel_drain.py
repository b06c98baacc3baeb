"""What a draining node tells a client (services/connection/drain.py): MQTT 5 gets
DISCONNECT 0x9C naming the Server Reference, 3.1.1 is closed, and a CONNECT still being
answered is refused with a CONNACK (0x9C and the reference; 3.1.1 return code 3)."""

from __future__ import annotations

from services.common.mqtt import ConnAck, Connect, Decoder, Disconnect, Will, encode
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel import Close, State
from tests.connection.harness import connected, new_channel, take, written

REF = "b.example:1883 c.example:1883"


def test_mqtt5_client_gets_0x9c_with_the_server_reference() -> None:
    ch, dec = connected(5)
    actions = ch.disconnect(RC.USE_ANOTHER_SERVER, "node draining", REF)
    assert actions == [Close(RC.USE_ANOTHER_SERVER, "node draining")]
    [bye] = written(ch, dec)
    assert isinstance(bye, Disconnect)
    assert bye.reason_code == RC.USE_ANOTHER_SERVER
    assert bye.properties.server_reference == REF
    assert ch.state is State.CLOSED


def test_without_a_reference_the_disconnect_names_none() -> None:
    ch, dec = connected(5)
    ch.disconnect(RC.USE_ANOTHER_SERVER, "node draining")
    [bye] = written(ch, dec)
    assert isinstance(bye, Disconnect) and bye.properties.server_reference is None


def test_mqtt311_client_is_closed_without_a_packet() -> None:
    ch, _ = connected(4)
    assert ch.disconnect(RC.USE_ANOTHER_SERVER, "node draining", REF) == [
        Close(RC.USE_ANOTHER_SERVER, "node draining")
    ]
    assert take(ch) == b""  # 3.1.1 has no server DISCONNECT


def test_connect_still_authenticating_is_refused_with_a_connack_naming_the_server() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 5, will=Will("w", b"x")), 5), 0.0)
    assert ch.state is State.AUTHENTICATING
    [close] = ch.disconnect(RC.USE_ANOTHER_SERVER, "draining", REF)
    assert isinstance(close, Close)
    [ack] = Decoder(5).feed(take(ch))
    assert isinstance(ack, ConnAck)
    assert ack.reason_code == RC.USE_ANOTHER_SERVER
    assert ack.properties.server_reference == REF
    assert ch.will is None  # a refused connection leaves no will


def test_mqtt311_connect_still_authenticating_gets_return_code_3() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("c", 4), 4), 0.0)
    ch.disconnect(RC.USE_ANOTHER_SERVER, "draining", REF)
    assert take(ch) == bytes.fromhex("20 02 00 03")  # CONNACK: server unavailable
