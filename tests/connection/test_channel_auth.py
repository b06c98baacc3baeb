"""Enhanced authentication in the channel (MQTT 5 section 4.12): the AUTH packets of the
exchange at CONNECT and of re-authentication, in order, and every AUTH out of turn refused."""

from __future__ import annotations

from services.common.connect import ConnectOutcome
from services.common.mqtt import Connect, Decoder, Properties, encode
from services.common.mqtt.packets import Auth, ConnAck, Disconnect, PingReq
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel import Authenticate, Channel, Close, Reauthenticate, State
from tests.connection.harness import new_channel, written

METHOD = "SCRAM-SHA-256"


def auth(code: int, data: bytes, method: str = METHOD) -> bytes:
    props = Properties(authentication_method=method, authentication_data=data)
    return encode(Auth(code, props), 5)


def started() -> tuple[Channel, Decoder, Connect]:
    """A channel that sent its challenge (AUTH 0x18) after CONNECT."""
    ch = new_channel()
    dec = Decoder(5)
    connect = Connect(
        "c", 5, properties=Properties(authentication_method=METHOD, authentication_data=b"cf")
    )
    assert ch.receive(encode(connect, 5), 0.0) == [Authenticate(connect, "c", b"cf", b"")]
    step = ConnectOutcome(auth_continue=True, auth_data=b"sf", auth_state=b"st1")
    assert ch.authenticated(step, 0.0) == []
    (challenge,) = written(ch, dec)
    assert challenge == Auth(
        RC.CONTINUE_AUTHENTICATION,
        Properties(authentication_method=METHOD, authentication_data=b"sf"),
    )
    assert ch.state is State.AUTHENTICATING
    return ch, dec, connect


def test_exchange_at_connect_ends_with_a_connack_carrying_the_final_data() -> None:
    ch, dec, connect = started()
    ping = encode(PingReq(), 5)
    # The client's answer is the next step, with the state the first step returned; a
    # packet after it waits for the CONNACK like any packet before it.
    actions = ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"cfinal") + ping, 1.0)
    assert actions == [Authenticate(connect, "c", b"cfinal", b"st1")]
    done = ConnectOutcome(tenant="t", epoch=1, auth_data=b"v=ok", identity="t/u")
    assert ch.authenticated(done, 1.0) == []
    connack, pingresp = written(ch, dec)
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    assert connack.properties.authentication_method == METHOD
    assert connack.properties.authentication_data == b"v=ok"
    assert type(pingresp).__name__ == "PingResp"


def test_refusal_after_the_proof_is_a_connack_with_its_code() -> None:
    ch, dec, _ = started()
    ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"bad proof"), 1.0)
    (close,) = ch.authenticated(ConnectOutcome(reason_code=RC.NOT_AUTHORIZED), 1.0)
    assert isinstance(close, Close)
    assert written(ch, dec) == [ConnAck(False, RC.NOT_AUTHORIZED)]


def test_auth_out_of_turn_or_with_another_method_is_a_protocol_error() -> None:
    ch, _, _ = started()
    (close,) = ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"x", method="PLAIN"), 1.0)
    assert isinstance(close, Close) and close.reason_code == RC.PROTOCOL_ERROR
    ch, _, _ = started()
    ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"x"), 1.0)
    # A second AUTH while the service still decides: nothing was asked of the client.
    (close,) = ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"y"), 1.0)
    assert isinstance(close, Close) and close.reason_code == RC.PROTOCOL_ERROR


def test_a_client_that_never_answers_the_challenge_is_closed() -> None:
    ch, _, _ = started()
    assert ch.tick(5.0) == []
    (close,) = ch.tick(10.5)
    assert isinstance(close, Close) and ch.state is State.CLOSED


def connected_with_method() -> tuple[Channel, Decoder]:
    ch, dec, _ = started()
    ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"cfinal"), 1.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, auth_data=b"v", identity="t/u"), 1.0)
    written(ch, dec)
    return ch, dec


def test_reauthentication_steps_and_success() -> None:
    ch, dec = connected_with_method()
    (step1,) = ch.receive(auth(RC.RE_AUTHENTICATE, b"cf2"), 2.0)
    assert step1 == Reauthenticate(METHOD, b"cf2", b"", "t/u")
    ch.reauthenticated(ConnectOutcome(auth_continue=True, auth_data=b"sf2", auth_state=b"s2"), 2)
    (challenge,) = written(ch, dec)
    assert isinstance(challenge, Auth) and challenge.reason_code == RC.CONTINUE_AUTHENTICATION
    (step2,) = ch.receive(auth(RC.CONTINUE_AUTHENTICATION, b"cfinal2"), 2.0)
    assert step2 == Reauthenticate(METHOD, b"cfinal2", b"s2", "t/u")
    assert ch.reauthenticated(ConnectOutcome(auth_data=b"v2"), 2.0) == []
    (success,) = written(ch, dec)
    assert success == Auth(
        RC.SUCCESS, Properties(authentication_method=METHOD, authentication_data=b"v2")
    )
    assert ch.state is State.CONNECTED
    # And again later.
    assert len(ch.receive(auth(RC.RE_AUTHENTICATE, b"cf3"), 3.0)) == 1


def test_failed_reauthentication_disconnects_with_its_code() -> None:
    ch, dec = connected_with_method()
    ch.receive(auth(RC.RE_AUTHENTICATE, b"cf2"), 2.0)
    (close,) = ch.reauthenticated(ConnectOutcome(reason_code=RC.NOT_AUTHORIZED), 2.0)
    assert isinstance(close, Close)
    assert written(ch, dec) == [Disconnect(RC.NOT_AUTHORIZED)]


def test_reauthentication_needs_the_connect_method() -> None:
    ch, _ = connected_with_method()
    (close,) = ch.receive(auth(RC.RE_AUTHENTICATE, b"x", method="SCRAM-SHA-512"), 2.0)
    assert close.reason_code == RC.PROTOCOL_ERROR  # type: ignore[union-attr]
    plain = new_channel()
    plain.receive(encode(Connect("c", 5), 5), 0.0)
    plain.authenticated(ConnectOutcome(tenant="t"), 0.0)
    (close,) = plain.receive(auth(RC.RE_AUTHENTICATE, b"x"), 1.0)
    assert close.reason_code == RC.PROTOCOL_ERROR  # type: ignore[union-attr]
