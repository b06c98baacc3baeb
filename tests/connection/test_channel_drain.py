"""What a draining node tells a client (services/connection/drain.py): MQTT 5 gets
DISCONNECT 0x9C naming the Server Reference, 3.1.1 is closed, and a CONNECT still being
answered is refused with a CONNACK (0x9C and the reference; 3.1.1 return code 3)."""

from __future__ import annotations

from services.common.connect import ConnectOutcome
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
    encode,
)
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel import Channel, ChannelConfig, Close, State
from tests.connection.harness import connected, kinds, new_channel, take, written

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


def _persistent() -> tuple[Channel, Decoder]:
    """An MQTT 5 session that outlives its connection, acks waiting for the node."""
    ch = new_channel(ChannelConfig(reason_strings=False, defer_publish_acks=True))
    props = Properties(session_expiry_interval=60)
    ch.receive(encode(Connect("c", 5, clean_start=False, properties=props), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, session_expiry_s=60), 0.0)
    ch.out.clear()
    return ch, Decoder(5)


def test_a_channel_that_stopped_reading_still_writes_the_acks_it_owes() -> None:
    """A drain stops reading a client before its DISCONNECT, then waits until the acks it
    owes are written (services/connection/drain.py)."""
    ch, dec = _persistent()
    assert kinds(ch.receive(encode(Publish("a", b"x", 2, packet_id=1), 5), 1.0)) == ["Route"]
    ch.publish_routed(1)
    assert written(ch, dec) == [PubRec(1)]
    assert not ch.owes_acks
    assert kinds(ch.receive(encode(PubRel(1), 5), 1.0)) == ["ReleaseQos2"]
    assert kinds(ch.receive(encode(Publish("a", b"y", 1, packet_id=2), 5), 1.0)) == ["Route"]
    assert ch.owes_acks  # PUBCOMP 1 waits for the release, PUBACK 2 for the routing

    ch.stop_reading()
    later = encode(Publish("a", b"z", 1, packet_id=3), 5) + encode(PubRel(7), 5)
    assert ch.receive(later, 2.0) == []  # dropped: the client sends them again elsewhere
    assert not ch.out
    ch.qos2_released(1)
    assert ch.owes_acks
    ch.publish_routed(2)
    assert not ch.owes_acks
    assert written(ch, dec) == [PubComp(1), PubAck(2)]
    ch.disconnect(RC.USE_ANOTHER_SERVER, "node draining", REF)
    [bye] = written(ch, dec)
    assert isinstance(bye, Disconnect) and bye.reason_code == RC.USE_ANOTHER_SERVER
