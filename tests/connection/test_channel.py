"""The channel state machine without any I/O: bytes and time in, bytes and actions out."""

from __future__ import annotations

from services.common.acl import Access, AclRule
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    PubAck,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from services.connection.actions import Authenticate, AuthResult, Close, Message, SubscribeRequest
from services.connection.channel import Channel, ChannelConfig, State


def _connected(level: int = 5, acl: tuple[AclRule, ...] = ()) -> tuple[Channel, Decoder]:
    ch = Channel(ChannelConfig(), "peer", 0.0)
    ch.receive(encode(Connect("c", level, keepalive_s=10), level), 0.0)
    assert [type(a) for a in ch.actions] == [Authenticate]
    ch.actions.clear()
    ch.on_authenticated(AuthResult(True, 0, "t", 1, False, acl), 0.0)
    dec = Decoder(level)
    assert isinstance(dec.feed(bytes(ch.out))[0], ConnAck)
    ch.out.clear()
    return ch, dec


def test_packets_before_connack_are_held_and_replayed() -> None:
    ch = Channel(ChannelConfig(), "peer", 0.0)
    ch.receive(encode(Connect("c", 5), 5) + encode(Publish("a", b"1", 1, packet_id=1), 5), 0.0)
    assert ch.publishes == [] and ch.state is State.AUTHENTICATING
    ch.on_authenticated(AuthResult(True, 0, "t", 1), 0.0)
    out = Decoder(5).feed(bytes(ch.out))
    assert [type(p) for p in out] == [ConnAck, PubAck]
    assert [m.payload for m in ch.publishes] == [b"1"]


def test_qos2_inbound_is_forwarded_once() -> None:
    ch, dec = _connected()
    pub = encode(Publish("a", b"x", 2, packet_id=9), 5)
    ch.receive(pub, 1.0)
    ch.receive(encode(Publish("a", b"x", 2, True, True, 9), 5), 1.0)  # DUP resend
    assert len(ch.publishes) == 1
    ch.receive(encode(PubRel(9), 5), 1.0)
    kinds = [type(p).__name__ for p in dec.feed(bytes(ch.out))]
    assert kinds == ["PubRec", "PubRec", "PubComp"]


def test_outbound_qos2_flow_and_window() -> None:
    ch, dec = _connected()
    ch.outbound.receive_maximum = 1
    for i in range(3):
        ch.deliver(Message("t", "a", str(i).encode(), 2, False), 2, False, (), 1.0)
    (first,) = dec.feed(bytes(ch.out))
    ch.out.clear()
    assert isinstance(first, Publish) and first.payload == b"0"
    ch.receive(encode(PubRec(first.packet_id or 0), 5), 1.0)
    (rel,) = dec.feed(bytes(ch.out))
    ch.out.clear()
    assert isinstance(rel, PubRel)
    ch.receive(
        encode(__import__("services.common.mqtt", fromlist=["PubComp"]).PubComp(rel.packet_id), 5),
        1.0,
    )
    (nxt,) = dec.feed(bytes(ch.out))
    assert isinstance(nxt, Publish) and nxt.payload == b"1"


def test_expired_message_is_not_delivered() -> None:
    ch, _dec = _connected()
    ch.deliver(Message("t", "a", b"old", 1, False, expires_at=5.0), 1, False, (), 6.0)
    assert not ch.out and ch.outbound.expired == 1


def test_keepalive_and_connect_timeout() -> None:
    ch, dec = _connected()
    ch.tick(14.0)
    assert ch.state is State.CONNECTED
    ch.tick(15.1)  # 1.5 x 10 s
    assert ch.state is State.CLOSED
    assert dec.feed(bytes(ch.out)) == [Disconnect(0x8D)]
    idle = Channel(ChannelConfig(connect_timeout_s=2), "peer", 0.0)
    idle.tick(2.5)
    assert idle.state is State.CLOSED and isinstance(idle.actions[0], Close)


def test_subscribe_checks_acl_and_filters() -> None:
    ch, dec = _connected(acl=(AclRule(False, Access.SUBSCRIBE, "deny/#"),))
    ch.receive(
        encode(
            Subscribe(
                1, (Subscription("ok/+", 1), Subscription("deny/x", 1), Subscription("bad/#/x", 0))
            ),
            5,
        ),
        1.0,
    )
    (req,) = ch.actions
    assert isinstance(req, SubscribeRequest)
    assert req.reason_codes == (1, 0x87, 0x8F)
    assert [s.filter for s, _ in req.subscriptions] == ["ok/+"]
    ch.on_subscribed(req)
    assert dec.feed(bytes(ch.out)) == [SubAck(1, (1, 0x87, 0x8F))]


def test_normal_disconnect_discards_the_will() -> None:
    from services.common.mqtt import Will

    ch = Channel(ChannelConfig(), "peer", 0.0)
    ch.receive(encode(Connect("c", 4, will=Will("w", b"x")), 4), 0.0)
    ch.on_authenticated(AuthResult(True, 0, "t", 1), 0.0)
    assert ch.will is not None
    ch.receive(encode(Disconnect(), 4), 1.0)
    assert ch.will is None and ch.state is State.CLOSED
