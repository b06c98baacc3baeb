"""MQTT 5 completeness at the channel: reason strings, Request Problem Information, Response
Information, redirection, `$SYS` publishes, inbound Receive Maximum for QoS 1 and 2, and the
CONNECT corner cases (3.1 Session Present, empty or wildcard will topic, zero limits), and a
PUBLISH with neither topic nor alias."""

from __future__ import annotations

import pytest

from services.common.acl import Access, AclRule
from services.common.connect import ConnectOutcome
from services.common.mqtt import (
    EMPTY,
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
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)
from services.connection.channel import (
    Authenticate,
    Channel,
    ChannelConfig,
    Close,
    Route,
    State,
    SubscribeRequest,
)
from tests.connection.harness import connected, kinds, new_channel, take, written

EXPLAIN = ChannelConfig()  # Reason Strings on: the node's default
DENY_NO = (AclRule(False, Access.ALL, "no/#"),)


def _reason(packet: object) -> str | None:
    return packet.properties.reason_string  # type: ignore[attr-defined, no-any-return]


# ---- CONNECT corner cases ----------------------------------------------------------------


def test_mqtt_3_1_connack_never_sets_session_present() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("old", 3, protocol_name="MQIsdp", clean_start=False), 3), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", session_present=True, session_expiry_s=9), 0.0)
    assert take(ch) == bytes.fromhex("20 02 00 00")  # 3.1 has no Session Present flag
    assert ch.state is State.CONNECTED and ch.persistent  # the session is resumed all the same


def test_mqtt_3_1_1_connack_keeps_session_present() -> None:
    ch = new_channel()
    ch.receive(encode(Connect("new", 4, clean_start=False), 4), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", session_present=True), 0.0)
    assert take(ch) == bytes.fromhex("20 02 01 00")


def test_empty_will_topic_is_a_protocol_error() -> None:
    ch = new_channel()
    actions = ch.receive(encode(Connect("c", 5, will=Will("", b"x")), 5), 0.0)
    assert kinds(actions) == ["Close"] and actions[0].reason_code == 0x82  # type: ignore[union-attr]
    assert take(ch) == encode(ConnAck(False, 0x82), 5)
    v3 = new_channel()
    actions = v3.receive(encode(Connect("c", 4, will=Will("", b"x")), 4), 0.0)
    assert kinds(actions) == ["Close"]
    assert not v3.out  # 3.1.1 has no return code for it: close without CONNACK


def test_a_will_topic_with_a_wildcard_is_refused_without_a_retry_invitation() -> None:
    """MQTT 5: CONNACK 0x90. 3.1.1 has no return code for it: a close without CONNACK, not
    return code 3 (server unavailable), which has clients retry the same CONNECT for ever."""
    ch = new_channel()
    actions = ch.receive(encode(Connect("c", 5, will=Will("a/+", b"x")), 5), 0.0)
    assert kinds(actions) == ["Close"] and actions[0].reason_code == 0x90  # type: ignore[union-attr]
    assert take(ch) == encode(ConnAck(False, 0x90), 5)
    v3 = new_channel()
    actions = v3.receive(encode(Connect("c", 4, will=Will("a/#", b"x")), 4), 0.0)
    assert kinds(actions) == ["Close"]
    assert not v3.out


def test_a_connack_larger_than_the_clients_maximum_packet_size_is_not_sent() -> None:
    """[MQTT-3.1.2-24]: a client whose Maximum Packet Size is below our CONNACK's size gets no
    CONNACK (and leaves no will); one that can take it gets it."""
    for mps, fits in ((8, False), (64, True)):
        ch = new_channel()
        will = Will("w", b"x")
        ch.receive(
            encode(Connect("c", 5, will=will, properties=Properties(maximum_packet_size=mps)), 5),
            0.0,
        )
        actions = ch.authenticated(ConnectOutcome(tenant="t"), 0.0)
        if fits:
            (ack,) = Decoder(5).feed(take(ch))
            assert isinstance(ack, ConnAck) and ack.reason_code == 0 and not actions
        else:
            assert kinds(actions) == ["Close"] and actions[0].reason_code == 0x95  # type: ignore[union-attr]
            assert not ch.out and ch.will is None and ch.state is State.CLOSED


def test_a_publish_with_neither_topic_nor_alias_is_a_protocol_error() -> None:
    ch, dec = connected(5)
    actions = ch.receive(encode_pub("", 1, 1), 1.0)
    assert kinds(actions) == ["Close"] and actions[0].reason_code == 0x82  # type: ignore[union-attr]
    (disc,) = written(ch, dec)
    assert isinstance(disc, Disconnect) and disc.reason_code == 0x82


@pytest.mark.parametrize("prop", ["receive_maximum", "maximum_packet_size"])
def test_connect_with_a_zero_limit_closes_without_session(prop: str) -> None:
    ch = new_channel()
    actions = ch.receive(encode(Connect("c", 5, properties=Properties(**{prop: 0})), 5), 0.0)
    assert kinds(actions) == ["Close"] and actions[0].reason_code == 0x82  # type: ignore[union-attr]
    assert ch.state is State.CLOSED and not ch.out


# ---- $SYS ----------------------------------------------------------------------------------


def test_v5_publish_to_sys_is_refused_with_0x87() -> None:
    ch, dec = connected(5, config=EXPLAIN)
    pub = encode_pub("$SYS/broker/uptime", 1, 1)
    assert ch.receive(pub, 1.0) == []  # nothing routed
    (ack,) = written(ch, dec)
    assert isinstance(ack, PubAck) and ack.reason_code == 0x87
    assert "$SYS" in (_reason(ack) or "")
    assert ch.receive(encode_pub("$SYS", 2, 2), 1.0) == []
    (rec,) = written(ch, dec)
    assert isinstance(rec, PubRec) and rec.reason_code == 0x87
    assert ch.receive(encode_pub("$SYS/x", 0), 1.0) == []  # QoS 0: dropped
    assert ch.receive(encode_pub("$SYSTEM/x", 0), 1.0) != []  # only $SYS itself is reserved


def test_v311_publish_to_sys_is_acknowledged_and_dropped() -> None:
    ch, dec = connected(4)
    assert ch.receive(encode(_publish("$SYS/x", 1, 3), 4), 1.0) == []
    assert written(ch, dec) == [PubAck(3)]


# ---- inbound Receive Maximum ---------------------------------------------------------------


def _deferring(level: int = 5) -> tuple[Channel, Decoder]:
    """Acks wait for the router, as on a node: they stay unacknowledged for a while."""
    cfg = ChannelConfig(reason_strings=False, receive_maximum=2, defer_publish_acks=True)
    return connected(level, config=cfg)


def test_more_unacknowledged_qos1_than_receive_maximum_closes_with_0x93() -> None:
    ch, dec = _deferring()
    data = b"".join(encode_pub("a", 1, pid) for pid in (1, 2, 3))
    actions = ch.receive(data, 1.0)
    assert kinds(actions) == ["Route", "Close"]
    assert isinstance(route := actions[0], Route) and len(route.messages) == 2  # not the third
    assert written(ch, dec) == [Disconnect(0x93)]


def test_qos1_acks_free_the_receive_window() -> None:
    ch, dec = _deferring()
    ch.receive(encode_pub("a", 1, 1) + encode_pub("a", 1, 2), 1.0)
    ch.publish_routed(1)
    assert written(ch, dec) == [PubAck(1)]
    assert kinds(ch.receive(encode_pub("a", 1, 3), 1.0)) == ["Route"]


def test_qos1_and_qos2_share_the_receive_window() -> None:
    ch, dec = _deferring()
    ch.receive(encode_pub("a", 2, 1), 1.0)
    ch.publish_routed(1)
    assert written(ch, dec) == [PubRec(1)]
    ch.receive(encode_pub("a", 1, 2), 1.0)  # 2 unacknowledged
    actions = ch.receive(encode_pub("a", 1, 3), 1.0)
    assert kinds(actions) == ["Close"] and written(ch, dec) == [Disconnect(0x93)]


def test_acks_sent_at_once_never_fill_the_window() -> None:
    ch, dec = connected(5, config=ChannelConfig(reason_strings=False, receive_maximum=2))
    data = b"".join(encode_pub("a", 1, pid) for pid in range(1, 11))
    assert kinds(ch.receive(data, 1.0)) == ["Route"]
    assert written(ch, dec) == [PubAck(pid) for pid in range(1, 11)]


def test_v311_qos1_is_not_limited_by_receive_maximum() -> None:
    ch, _ = _deferring(level=4)
    data = b"".join(encode(_publish("a", 1, pid), 4) for pid in (1, 2, 3, 4))
    assert kinds(ch.receive(data, 1.0)) == ["Route"]


# ---- Reason Strings ------------------------------------------------------------------------


def test_refused_publish_explains_itself() -> None:
    ch, dec = connected(5, config=EXPLAIN, acl=DENY_NO)
    ch.receive(encode_pub("no/x", 1, 1), 1.0)
    (ack,) = written(ch, dec)
    assert ack == PubAck(1, 0x87, Properties(reason_string="not authorized to publish to no/x"))
    ch.receive(encode_pub("ok", 1, 2), 1.0)
    assert written(ch, dec) == [PubAck(2)]  # success carries no Reason String


def test_request_problem_information_0_keeps_acks_bare_but_not_disconnect() -> None:
    ch, dec = connected(
        5, config=EXPLAIN, acl=DENY_NO, connect_props=Properties(request_problem_information=0)
    )
    ch.receive(encode_pub("no/x", 1, 1), 1.0)
    assert written(ch, dec) == [PubAck(1, 0x87)]  # [MQTT-3.1.2-29]
    ch.receive(encode(Subscribe(2, (Subscription("no/#", 0),)), 5), 1.0)
    ch.receive(encode(Unsubscribe(3, ("never",)), 5), 1.0)
    ch.receive(encode(PubRel(9), 5), 1.0)
    (unsuback, pubcomp) = written(ch, dec)
    assert _reason(unsuback) is None and _reason(pubcomp) is None
    ch.disconnect(0x98, "kicked by an administrator")
    (disconnect,) = written(ch, dec)
    assert disconnect == Disconnect(0x98, Properties(reason_string="kicked by an administrator"))


def test_reason_strings_can_be_turned_off() -> None:
    ch, dec = connected(5, acl=DENY_NO)  # the harness default: reason_strings=False
    ch.receive(encode_pub("no/x", 1, 1), 1.0)
    assert written(ch, dec) == [PubAck(1, 0x87)]
    ch.disconnect(0x98, "kicked")
    assert written(ch, dec) == [Disconnect(0x98)]


def test_reason_string_left_out_when_the_client_could_not_take_it() -> None:
    small = Properties(maximum_packet_size=24)  # a CONNACK, a bare PUBACK; no explanation
    ch, dec = connected(5, config=EXPLAIN, acl=DENY_NO, connect_props=small)
    ch.receive(encode_pub("no/x", 1, 1), 1.0)
    assert written(ch, dec) == [PubAck(1, 0x87)]  # [MQTT-3.1.2-25]


def test_suback_and_unsuback_explain_refusals() -> None:
    ch, dec = connected(5, config=EXPLAIN, acl=DENY_NO)
    (req,) = ch.receive(
        encode(Subscribe(1, (Subscription("ok", 1), Subscription("no/#", 0))), 5), 1.0
    )
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(req)
    (suback,) = written(ch, dec)
    assert isinstance(suback, SubAck) and suback.reason_codes == (1, 0x87)
    assert _reason(suback) == "1 of 2 filters refused: not authorized"
    ch.receive(encode(Unsubscribe(2, ("ok", "never")), 5), 1.0)
    (unsuback,) = written(ch, dec)
    assert unsuback == UnsubAck(
        2, (0, 0x11), Properties(reason_string="no subscription existed for never")
    )


def test_disconnect_for_a_protocol_error_says_what_was_wrong() -> None:
    ch, dec = connected(5, config=EXPLAIN)
    ch.receive(encode(PubComp(77), 5), 1.0)  # unknown id: ignored
    ch.receive(bytes.fromhex("36 05 0001 61 0001"), 1.0)  # QoS 3
    (disconnect,) = written(ch, dec)
    assert isinstance(disconnect, Disconnect) and disconnect.reason_code == 0x81
    assert "QoS 3" in (_reason(disconnect) or "")


def test_refused_connack_carries_a_reason_string() -> None:
    ch = new_channel(EXPLAIN)
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    ch.authenticated(ConnectOutcome(reason_code=0x86), 0.0)
    (connack,) = Decoder(5).feed(take(ch))
    assert connack == ConnAck(False, 0x86, Properties(reason_string="bad user name or password"))


# ---- Response Information ------------------------------------------------------------------


def _connack(cfg: ChannelConfig, client_id: str = "dev-1", rri: int | None = 1) -> ConnAck:
    ch = new_channel(cfg)
    props = Properties(request_response_information=rri)
    ch.receive(encode(Connect(client_id, 5, properties=props), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t"), 0.0)
    (connack,) = Decoder(5).feed(take(ch))
    assert isinstance(connack, ConnAck)
    return connack


def test_response_information_when_requested() -> None:
    cfg = ChannelConfig(response_information="$response/{client_id}")
    assert _connack(cfg).properties.response_information == "$response/dev-1"
    assert _connack(cfg, rri=0).properties.response_information is None
    assert _connack(cfg, rri=None).properties.response_information is None
    assert _connack(ChannelConfig()).properties.response_information is None  # "": off
    # A client id that cannot be part of a topic name gets none rather than a useless one.
    assert _connack(cfg, client_id="a+b").properties.response_information is None


# ---- redirection ---------------------------------------------------------------------------

REDIRECTING = ChannelConfig(redirects={"acme": ("b.example:1883", True), "beta": ("c:1", False)})


@pytest.mark.parametrize(
    ("username", "code", "reference"),
    [("acme/alice", 0x9D, "b.example:1883"), ("beta/bob", 0x9C, "c:1")],
)
def test_redirected_tenant_gets_server_reference(username: str, code: int, reference: str) -> None:
    ch = new_channel(REDIRECTING)
    actions = ch.receive(encode(Connect("c", 5, username=username), 5), 0.0)
    assert actions == [Close(code, actions[0].reason)]  # type: ignore[union-attr]
    (connack,) = Decoder(5).feed(take(ch))
    assert isinstance(connack, ConnAck) and connack.reason_code == code
    assert connack.properties.server_reference == reference
    assert not connack.session_present


def test_other_tenants_are_not_redirected() -> None:
    ch = new_channel(REDIRECTING)
    for username in ("other/alice", "alice", None):
        ch = new_channel(REDIRECTING)
        (action,) = ch.receive(encode(Connect("c", 5, username=username), 5), 0.0)
        assert isinstance(action, Authenticate)


def test_redirected_v311_client_gets_server_unavailable() -> None:
    ch = new_channel(REDIRECTING)
    assert kinds(ch.receive(encode(Connect("c", 4, username="acme/a"), 4), 0.0)) == ["Close"]
    assert take(ch) == bytes.fromhex("20 02 00 03")  # 3.1.1 cannot say where to go


# ---- helpers -------------------------------------------------------------------------------


def _publish(topic: str, qos: int, pid: int | None = None) -> Publish:
    return Publish(topic, b"x", qos, packet_id=pid if qos else None, properties=EMPTY)


def encode_pub(topic: str, qos: int, pid: int | None = None) -> bytes:
    return encode(_publish(topic, qos, pid), 5)
