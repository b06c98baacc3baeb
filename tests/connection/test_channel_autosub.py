"""Auto-subscriptions at connect: the CONNACK waits until the node has them in place, the
packets that come meanwhile wait with it, and a node that cannot put them in place in time
refuses the CONNECT so the client retries."""

from __future__ import annotations

import pytest

from services.common.acl import Access, AclRule
from services.common.connect import ConnectOutcome
from services.common.message import Message
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Properties,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel import (
    AutoSubscribe,
    ChannelConfig,
    Close,
    Route,
    State,
    SubscribeRequest,
)
from services.connection.channel.core import Channel
from tests.connection.harness import PLAIN, kinds, new_channel, take

AUTO = [("cmd/dev/#", 1), ("all/news", 0)]


def accepted(
    level: int = 5, outcome: ConnectOutcome | None = None, config: ChannelConfig = PLAIN
) -> tuple[Channel, AutoSubscribe]:
    """A channel whose session was accepted with AUTO: its CONNACK waits."""
    ch = new_channel(config)
    ch.receive(encode(Connect("dev", level), level), 0.0)
    (auto,) = ch.authenticated(outcome or ConnectOutcome(tenant="t", epoch=1), 0.0, AUTO)
    assert isinstance(auto, AutoSubscribe)
    return ch, auto


def test_the_connack_waits_for_the_auto_subscriptions_and_held_packets_follow_it() -> None:
    ch, auto = accepted()
    assert auto.request.subscriptions == (
        (Subscription("cmd/dev/#", 1), None),
        (Subscription("all/news", 0), None),
    )
    assert ch.state is State.ACCEPTED and not ch.out  # no CONNACK yet
    assert ch.subscriptions == {"cmd/dev/#": None, "all/news": None}  # the client's own
    # The client does not wait for its CONNACK: what it sends meanwhile waits too.
    early = encode(Publish("up", b"1", qos=1, packet_id=1), 5)
    early += encode(Subscribe(2, (Subscription("more", 0),)), 5)
    assert ch.receive(early, 0.1) == []
    # Nothing is delivered before the CONNACK.
    ch.deliver(Message("t", "cmd/dev/x", b"x", 1, False), 1, False, (), 0.1)
    assert not ch.out
    actions = ch.auto_subscribed(True, 0.2)
    assert kinds(actions) == ["Route", "SubscribeRequest"]
    assert isinstance(actions[0], Route) and actions[0].messages[0].topic == "up"
    assert codes(take(ch)) == [("ConnAck", 0), ("PubAck", 0)]  # in that order
    assert ch.state is State.CONNECTED
    ch.subscribed(actions[1])  # type: ignore[arg-type]
    assert Decoder(5).feed(take(ch)) == [SubAck(2, (0,))]


def codes(data: bytes, level: int = 5) -> list[tuple[str, int]]:
    """(packet type, reason code) of each packet in `data`."""
    return [(type(p).__name__, p.reason_code) for p in Decoder(level).feed(data)]  # type: ignore[union-attr]


def test_none_to_take_answers_at_once() -> None:
    """Held already by the resumed session, or refused by the ACL: nothing to wait for."""
    ch = new_channel()
    ch.receive(encode(Connect("dev", 4), 4), 0.0)
    outcome = ConnectOutcome(
        tenant="t",
        session_present=True,
        subscriptions=((Subscription("cmd/dev/#", 1), None),),
        acl=(AclRule(False, Access.SUBSCRIBE, "all/#"),),
    )
    assert ch.authenticated(outcome, 0.0, AUTO) == []
    assert take(ch) == encode(ConnAck(True, 0), 4)
    assert ch.state is State.CONNECTED


# MQTT 5: 0x88 Server unavailable; 3.1.1: return code 3, Server unavailable.
@pytest.mark.parametrize(
    ("level", "connack"), [(5, b"\x20\x03\x00\x88\x00"), (4, b"\x20\x02\x00\x03")]
)
def test_not_in_place_refuses_the_connect_so_the_client_retries(level: int, connack: bytes) -> None:
    ch, _ = accepted(level)
    (close,) = ch.auto_subscribed(False, 1.0)
    assert isinstance(close, Close) and close.reason_code == RC.SERVER_UNAVAILABLE
    assert take(ch) == connack
    assert ch.state is State.CLOSED and ch.will is None


def test_a_connack_waiting_too_long_refuses_the_connect_and_counts_the_limit() -> None:
    hits: list[str] = []
    cfg = ChannelConfig(reason_strings=False, auto_subscribe_timeout_s=10.0)
    ch = Channel(cfg, "peer", 0.0, lambda: "id", on_limit=lambda name, tenant: hits.append(name))
    ch.receive(encode(Connect("dev", 5), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t"), 100.0, AUTO)
    assert ch.tick(109.0) == []
    assert kinds(ch.tick(110.5)) == ["Close"]
    assert Decoder(5).feed(take(ch)) == [ConnAck(False, 0x88)]
    assert hits == ["auto_subscribe_timeout_s"]
    assert ch.auto_subscribed(True, 111.0) == []  # too late: nothing more is written
    assert not ch.out


def test_a_kick_while_waiting_sends_the_connack_then_the_disconnect() -> None:
    ch, _ = accepted()
    assert kinds(ch.disconnect(RC.SESSION_TAKEN_OVER, "kicked")) == ["Close"]
    assert codes(take(ch)) == [("ConnAck", 0), ("Disconnect", 0x8E)]


def test_a_redirect_while_waiting_refuses_with_the_server_reference() -> None:
    ch, _ = accepted()
    ch.disconnect(RC.USE_ANOTHER_SERVER, "draining", "other:1883")
    refusal = ConnAck(False, 0x9C, Properties(server_reference="other:1883"))
    assert Decoder(5).feed(take(ch)) == [refusal]


def test_the_request_is_what_the_node_subscribes() -> None:
    _, auto = accepted()
    req = auto.request
    assert isinstance(req, SubscribeRequest)
    assert req.reason_codes == (1, 0) and req.fresh == (True, True)
