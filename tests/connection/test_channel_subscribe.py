"""SUBSCRIBE and UNSUBSCRIBE: what the node is asked to do, SUBACK/UNSUBACK, action order."""

from __future__ import annotations

import pytest

from services.common.acl import Access, AclRule
from services.common.mqtt import (
    Disconnect,
    Properties,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    encode,
)
from services.connection.channel import Route, SubscribeRequest, Unsubscribed
from tests.connection.harness import connected, kinds, written

_DENY = (AclRule(False, Access.SUBSCRIBE, "deny/#"),)
_MIXED = (Subscription("ok/+", 1), Subscription("deny/x", 1), Subscription("bad/#/x", 0))


@pytest.mark.parametrize(("level", "codes"), [(5, (1, 0x87, 0x8F)), (4, (1, 0x80, 0x80))])
def test_subscribe_checks_acl_and_filters(level: int, codes: tuple[int, ...]) -> None:
    ch, dec = connected(level, acl=_DENY)
    (req,) = ch.receive(encode(Subscribe(1, _MIXED), level), 1.0)
    assert isinstance(req, SubscribeRequest)
    assert req.reason_codes == codes
    assert req.subscriptions == ((Subscription("ok/+", 1), None),)
    assert not ch.out  # SUBACK waits until the node has the subscription in place
    ch.subscribed(req)
    assert written(ch, dec) == [SubAck(1, codes)]
    assert ch.subscriptions == {"ok/+": None}


def test_subscription_identifier_and_fresh_flags() -> None:
    ch, _ = connected(5)
    first = Subscribe(1, (Subscription("a", 0),))
    (req,) = ch.receive(encode(first, 5), 1.0)
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(req)
    again = Subscribe(
        2,
        (Subscription("a", 1), Subscription("b", 1)),
        Properties(subscription_identifier=(9,)),
    )
    (req,) = ch.receive(encode(again, 5), 1.0)
    assert isinstance(req, SubscribeRequest)
    assert req.subscriptions == ((Subscription("a", 1), 9), (Subscription("b", 1), 9))
    assert req.fresh == (False, True)  # retain handling 1 sends retained only to "b"


def test_no_local_on_a_shared_subscription_is_a_protocol_error() -> None:
    ch, dec = connected(5)
    sub = Subscribe(1, (Subscription("$share/g/a", 0, no_local=True),))
    assert kinds(ch.receive(encode(sub, 5), 1.0)) == ["Close"]  # [MQTT-3.8.3-4]
    assert written(ch, dec) == [Disconnect(0x82)]


@pytest.mark.parametrize(("level", "codes"), [(5, (0, 0x11)), (4, ())])
def test_unsubscribe_answers_at_once(level: int, codes: tuple[int, ...]) -> None:
    ch, dec = connected(level)
    (req,) = ch.receive(encode(Subscribe(1, (Subscription("a", 0),)), level), 1.0)
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(req)
    written(ch, dec)
    actions = ch.receive(encode(Unsubscribe(2, ("a", "never")), level), 1.0)
    assert actions == [Unsubscribed(("a", "never"))]
    assert written(ch, dec) == [UnsubAck(2, codes)]
    assert ch.subscriptions == {}


def test_actions_keep_packet_order() -> None:
    ch, _ = connected(5)
    pub = encode(Publish("x", b"1"), 5)
    sub = encode(Subscribe(1, (Subscription("x", 0),)), 5)
    assert kinds(ch.receive(sub + pub, 1.0)) == ["SubscribeRequest", "Route"]
    actions = ch.receive(pub + pub + sub + pub, 1.0)
    assert kinds(actions) == ["Route", "SubscribeRequest", "Route"]
    first, _, last = actions
    assert isinstance(first, Route) and len(first.messages) == 2
    assert isinstance(last, Route) and len(last.messages) == 1


def test_suback_after_close_is_not_written() -> None:
    ch, _ = connected(5)
    (req,) = ch.receive(encode(Subscribe(1, (Subscription("a", 0),)), 5), 1.0)
    assert isinstance(req, SubscribeRequest)
    ch.connection_lost()
    ch.subscribed(req)
    assert not ch.out
