"""Per-connection limits a channel enforces: packet size before and after CONNACK, user
properties, filters per packet, subscriptions per client, topic length and levels, keep
alive, the CONNECT timeout; and that each hit is reported by setting name."""

from __future__ import annotations

import pytest

from services.common.connect import ConnectOutcome
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    Properties,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    encode,
)
from services.common.topics import TopicLimits
from services.connection.channel import (
    Authenticate,
    Channel,
    ChannelConfig,
    Close,
    State,
    SubscribeRequest,
    Unsubscribed,
)
from services.connection.subscribing import refused
from tests.connection.harness import kinds

SMALL = ChannelConfig(
    max_packet_size_bytes=4096,
    max_connect_packet_size_bytes=512,
    max_user_properties=4,
    max_filters_per_subscribe=4,
    max_subscriptions_per_client=5,
    topic_limits=TopicLimits(max_length_bytes=64, max_levels=4),
    reason_strings=False,  # byte-exact replies; reason strings have tests of their own
)


class Hits:
    """The `on_limit` of a channel under test: the setting names it reported."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def __call__(self, limit: str, tenant: str) -> None:
        self.names.append(limit)


def _channel(config: ChannelConfig = SMALL) -> tuple[Channel, Hits]:
    hits = Hits()
    return Channel(config, "peer", 0.0, lambda: "auto", on_limit=hits), hits


def _connected(level: int, config: ChannelConfig = SMALL) -> tuple[Channel, Hits, Decoder]:
    ch, hits = _channel(config)
    actions = ch.receive(encode(Connect("c", level, keepalive_s=10), level), 0.0)
    assert kinds(actions) == ["Authenticate"]
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    assert ch.state is State.CONNECTED
    ch.out.clear()
    return ch, hits, Decoder(level)


def _written(ch: Channel, level: int) -> list[object]:
    packets = Decoder(level).feed(bytes(ch.out))
    ch.out.clear()
    return list(packets)


def _user_props(n: int) -> Properties:
    return Properties(user_property=tuple((f"k{i}", "v") for i in range(n)))


# ---- packet size before and after CONNACK --------------------------------------------------


def test_oversize_mqtt5_connect_gets_connack_0x95_from_its_header_alone() -> None:
    ch, hits = _channel()
    raw = encode(Connect("c", 5, properties=Properties(user_property=(("k", "v" * 600),))), 5)
    assert len(raw) > 512
    # Only the fixed header and the protocol name/level have arrived: refused already.
    actions = ch.receive(raw[:12], 0.0)
    assert kinds(actions) == ["Close"]
    assert _written(ch, 5) == [ConnAck(False, 0x95)]
    assert hits.names == ["max_connect_packet_size_bytes"]


def test_oversize_311_connect_is_closed_without_connack() -> None:
    ch, hits = _channel()
    raw = encode(Connect("c" * 600, 4), 4)
    actions = ch.receive(raw, 0.0)
    assert kinds(actions) == ["Close"]
    assert isinstance(actions[0], Close) and actions[0].reason_code == 0x95
    assert not ch.out  # 3.1.1 has no return code for it: just close
    assert hits.names == ["max_connect_packet_size_bytes"]


def test_connect_limit_holds_until_connack_then_the_full_size_applies() -> None:
    ch, hits = _channel()
    ch.receive(encode(Connect("c", 5), 5), 0.0)
    assert ch.state is State.AUTHENTICATING
    big = encode(Publish("a/b", b"x" * 1000), 5)  # over 512, under 4096
    # Before the CONNACK the small limit still applies to what is held.
    actions = ch.receive(big, 0.0)
    assert kinds(actions) == ["Close"]
    assert _written(ch, 5) == [ConnAck(False, 0x95)]
    assert hits.names == ["max_connect_packet_size_bytes"]

    ch, hits, _ = _connected(5)
    actions = ch.receive(big, 0.0)
    assert kinds(actions) == ["Route"]
    too_big = encode(Publish("a/b", b"x" * 5000), 5)
    assert kinds(ch.receive(too_big, 0.0)) == ["Close"]
    assert _written(ch, 5) == [Disconnect(0x95)]
    assert hits.names == ["max_packet_size_bytes"]


# ---- counts read while decoding --------------------------------------------------------------


def test_connect_with_too_many_user_properties_gets_connack_0x97() -> None:
    ch, hits = _channel()
    actions = ch.receive(encode(Connect("c", 5, properties=_user_props(5)), 5), 0.0)
    assert kinds(actions) == ["Close"]
    assert _written(ch, 5) == [ConnAck(False, 0x97)]
    assert hits.names == ["max_user_properties"]
    ch, _ = _channel()
    assert kinds(ch.receive(encode(Connect("c", 5, properties=_user_props(4)), 5), 0.0)) == [
        "Authenticate"
    ]


def test_will_properties_are_bounded_too() -> None:
    ch, hits = _channel()
    will = Will("w", b"", properties=_user_props(5))
    assert kinds(ch.receive(encode(Connect("c", 5, will=will), 5), 0.0)) == ["Close"]
    assert _written(ch, 5) == [ConnAck(False, 0x97)]
    assert hits.names == ["max_user_properties"]


def test_publish_with_too_many_user_properties_is_disconnected_0x97() -> None:
    ch, hits, _ = _connected(5)
    actions = ch.receive(encode(Publish("a", b"", properties=_user_props(4)), 5), 0.0)
    assert kinds(actions) == ["Route"]
    actions = ch.receive(encode(Publish("a", b"", properties=_user_props(5)), 5), 0.0)
    assert kinds(actions) == ["Close"]
    assert _written(ch, 5) == [Disconnect(0x97)]
    assert hits.names == ["max_user_properties"]


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize(
    "packet",
    [
        Subscribe(1, tuple(Subscription(f"f/{i}", 0) for i in range(5))),
        Unsubscribe(1, tuple(f"f/{i}" for i in range(5))),
    ],
)
def test_too_many_filters_in_one_packet_closes_0x97(
    level: int, packet: Subscribe | Unsubscribe
) -> None:
    ch, hits, _ = _connected(level)
    actions = ch.receive(encode(packet, level), 0.0)
    assert kinds(actions) == ["Close"]
    assert isinstance(actions[0], Close) and actions[0].reason_code == 0x97
    assert _written(ch, level) == ([Disconnect(0x97)] if level == 5 else [])
    assert hits.names == ["max_filters_per_subscribe"]


# ---- subscriptions per client ---------------------------------------------------------------


@pytest.mark.parametrize(("level", "refusal"), [(5, 0x97), (4, 0x80)])
def test_subscriptions_per_client_are_capped(level: int, refusal: int) -> None:
    ch, hits, _ = _connected(level)
    first = Subscribe(1, tuple(Subscription(f"f/{i}", 1) for i in range(3)))
    (req,) = ch.receive(encode(first, level), 0.0)
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(req)
    # Re-subscribing an existing filter takes no room; two new ones fit, the third does not.
    more = (Subscription("f/0", 0), Subscription("g/1", 0), Subscription("g/2", 0))
    second = Subscribe(2, (*more, Subscription("g/3", 0)))
    (req,) = ch.receive(encode(second, level), 0.0)
    assert isinstance(req, SubscribeRequest)
    assert req.reason_codes == (0, 0, 0, refusal)
    ch.subscribed(req)
    assert len(ch.subscriptions) == 5
    assert _written(ch, level)[-1] == SubAck(2, (0, 0, 0, refusal))
    assert hits.names == ["max_subscriptions_per_client"]
    # Room comes back with an UNSUBSCRIBE.
    ch.receive(encode(Unsubscribe(3, ("g/1",)), level), 0.0)
    (req,) = ch.receive(encode(Subscribe(4, (Subscription("g/3", 0),)), level), 0.0)
    assert isinstance(req, SubscribeRequest) and req.reason_codes == (0,)


def test_subscribes_in_flight_count_against_the_limit() -> None:
    """A client that fires SUBSCRIBEs without waiting for SUBACKs cannot overshoot."""
    ch, _, _ = _connected(5)
    requests = []
    for pid in range(1, 5):
        subs = tuple(Subscription(f"p{pid}/{i}", 0) for i in range(2))
        (req,) = ch.receive(encode(Subscribe(pid, subs), 5), 0.0)
        assert isinstance(req, SubscribeRequest)
        requests.append(req)
    granted = sum(code < 0x80 for r in requests for code in r.reason_codes)
    assert granted == 5
    for req in requests:
        ch.subscribed(req)
    assert len(ch.subscriptions) == 5


def test_a_subscribe_the_node_refused_gives_its_room_back() -> None:
    ch, _, _ = _connected(5)
    subs = tuple(Subscription(f"f/{i}", 0) for i in range(3))
    (req,) = ch.receive(encode(Subscribe(1, subs), 5), 0.0)
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(refused(req))  # the node could not subscribe: 0x80 for each
    assert ch.subscriptions == {}
    for pid in (2, 3):  # 2 + 3 new filters: all of the room again
        subs = tuple(Subscription(f"g{pid}/{i}", 0) for i in range(pid))
        (req,) = ch.receive(encode(Subscribe(pid, subs), 5), 0.0)
        assert isinstance(req, SubscribeRequest)
        assert req.reason_codes == (0,) * pid


# ---- topic length and levels ----------------------------------------------------------------


def test_publish_topic_over_the_limits_is_disconnected_0x90() -> None:
    for topic, limit in (("x" * 65, "max_topic_length_bytes"), ("a/b/c/d/e", "max_topic_levels")):
        ch, hits, _ = _connected(5)
        assert kinds(ch.receive(encode(Publish(topic, b""), 5), 0.0)) == ["Close"]
        assert _written(ch, 5) == [Disconnect(0x90)]
        assert hits.names == [limit]
    ch, _, _ = _connected(5)
    assert kinds(ch.receive(encode(Publish("a/b/c/" + "x" * 58, b""), 5), 0.0)) == ["Route"]


@pytest.mark.parametrize(("level", "code"), [(5, 0x8F), (4, 0x80)])
def test_subscribe_filter_over_the_limits_is_refused(level: int, code: int) -> None:
    ch, hits, _ = _connected(level)
    subs = (
        Subscription("x" * 65, 0),
        Subscription("a/b/c/d/#", 0),
        Subscription("$share/" + "g" * 60 + "/y", 0),  # the group name counts too
        Subscription("$share/g/a/+/c/#", 1),
    )
    (req,) = ch.receive(encode(Subscribe(1, subs), level), 0.0)
    assert isinstance(req, SubscribeRequest)
    assert req.reason_codes == (code, code, code, 1)
    assert hits.names == ["max_topic_length_bytes", "max_topic_levels", "max_topic_length_bytes"]


def test_unsubscribe_of_an_invalid_filter_gets_0x8f_and_never_reaches_the_node() -> None:
    ch, hits, dec = _connected(5)
    (req,) = ch.receive(encode(Subscribe(1, (Subscription("a", 0),)), 5), 0.0)
    assert isinstance(req, SubscribeRequest)
    ch.subscribed(req)
    ch.out.clear()
    actions = ch.receive(encode(Unsubscribe(2, ("a", "x" * 65, "$share/", "b")), 5), 0.0)
    assert actions == [Unsubscribed(("a", "b"))]
    assert dec.feed(bytes(ch.out)) == [UnsubAck(2, (0, 0x8F, 0x8F, 0x11))]
    assert hits.names == ["max_topic_length_bytes"]


def test_will_topic_over_the_limits_refuses_the_connect() -> None:
    ch, hits = _channel()
    will = Will("a/b/c/d/e", b"")
    assert kinds(ch.receive(encode(Connect("c", 5, will=will), 5), 0.0)) == ["Close"]
    assert _written(ch, 5) == [ConnAck(False, 0x90)]
    assert hits.names == ["max_topic_levels"]


# ---- keep alive -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "server", "hit"),
    [(0, 3600, "server_keepalive_s"), (65535, 3600, "max_keepalive_s"), (60, None, None)],
)
def test_mqtt5_keep_alive_is_capped_and_imposed_on_zero(
    asked: int, server: int | None, hit: str | None
) -> None:
    ch, hits = _channel(ChannelConfig(reason_strings=False))
    (auth,) = ch.receive(encode(Connect("c", 5, keepalive_s=asked), 5), 0.0)
    assert isinstance(auth, Authenticate)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    (ack,) = _written(ch, 5)
    assert isinstance(ack, ConnAck) and ack.properties.server_keep_alive == server
    assert hits.names == ([hit] if hit else [])
    effective = server or asked
    assert ch.tick(1.5 * effective - 1) == []
    assert kinds(ch.tick(1.5 * effective + 1)) == ["Close"]
    assert _written(ch, 5) == [Disconnect(0x8D)]


def test_server_keepalive_zero_lets_mqtt5_clients_turn_it_off() -> None:
    ch, _ = _channel(ChannelConfig(server_keepalive_s=0, reason_strings=False))
    ch.receive(encode(Connect("c", 5, keepalive_s=0), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    (ack,) = _written(ch, 5)
    assert isinstance(ack, ConnAck) and ack.properties.server_keep_alive is None
    assert ch.tick(1e6) == []


def test_a_311_client_asking_too_long_is_held_to_the_maximum() -> None:
    ch, hits = _channel(ChannelConfig(reason_strings=False))
    ch.receive(encode(Connect("c", 4, keepalive_s=65535), 4), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    assert _written(ch, 4) == [ConnAck(False, 0)]  # nothing to tell it with
    assert hits.names == ["max_keepalive_s"]
    assert ch.tick(5399.0) == []
    assert kinds(ch.tick(5401.0)) == ["Close"]


def test_a_311_client_asking_zero_keeps_it_off() -> None:
    ch, hits = _channel(ChannelConfig(reason_strings=False))
    ch.receive(encode(Connect("c", 4, keepalive_s=0), 4), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    assert ch.tick(1e6) == []
    assert hits.names == []


# ---- CONNECT timeout ------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", b"\x10\x20\x00\x04MQ"])
def test_a_connect_that_never_completes_is_closed_at_the_timeout(sent: bytes) -> None:
    ch, hits = _channel(ChannelConfig(connect_timeout_s=5.0, reason_strings=False))
    assert ch.receive(sent, 1.0) == []
    assert ch.tick(4.9) == []
    actions = ch.tick(5.1)
    assert kinds(actions) == ["Close"]
    assert isinstance(actions[0], Close) and actions[0].reason_code == 0xA0
    assert not ch.out
    assert hits.names == ["connect_timeout_s"]


def test_defaults_are_the_documented_ones() -> None:
    from services.connection.config import ConnectionSettings

    s = ConnectionSettings()
    c = ChannelConfig()
    pairs = [
        (s.max_connect_packet_size_bytes, c.max_connect_packet_size_bytes, 64 << 10),
        (s.max_user_properties, c.max_user_properties, 256),
        (s.max_filters_per_subscribe, c.max_filters_per_subscribe, 100),
        (s.max_subscriptions_per_client, c.max_subscriptions_per_client, 1000),
        (s.max_keepalive_s, c.max_keepalive_s, 3600),
        (s.server_keepalive_s, c.server_keepalive_s, 3600),
        (s.connect_timeout_s, c.connect_timeout_s, 5.0),
    ]
    assert all(a == b == want for a, b, want in pairs), pairs


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"max_connect_packet_size_bytes": 32 << 20}, "max_connect_packet_size_bytes"),
        ({"max_keepalive_s": 60, "server_keepalive_s": 120}, "server_keepalive_s"),
    ],
)
def test_inconsistent_limits_stop_start_up_naming_the_setting(
    env: dict[str, int], setting: str
) -> None:
    from pydantic import ValidationError

    from services.connection.config import ConnectionSettings

    with pytest.raises(ValidationError, match=setting):
        ConnectionSettings(**env)  # type: ignore[arg-type]
