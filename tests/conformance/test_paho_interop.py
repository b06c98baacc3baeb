"""Behaviours Eclipse Paho's interoperability suite (client_test5.py, client_test.py) checks,
each named after the suite's test, on the two-node mesh.

The suite reconnects the same few client ids back to back; `test_paho_sequence_twice` runs a
short sequence of its steps twice with the same ids (no leftover session, will or retained
message may change the second run). Client ids are unique per test and each connects fewer
than 15 times, so no test depends on whether the mesh bans flapping clients.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PubAck,
    Publish,
    Subscription,
    Will,
)
from tests.conformance.wire import (
    connect,
    connected,
    disconnected_with,
    next_publish,
    publish_acked,
    subscribe,
    uid,
)
from tests.conftest import MeshInfo
from tests.e2e.clients import Raw
from tests.poll import holds_within

pytestmark = pytest.mark.e2e

END = b"end"  # the sentinel a publisher sends last on the same ordered path


def payloads_until_end(raw: Raw) -> list[bytes]:
    """Payloads of every PUBLISH before the sentinel (QoS 1 ones acknowledged)."""
    got: list[bytes] = []
    while (p := next_publish(raw).payload) != END:
        got.append(p)
    return got


def echoed(raw: Raw, p: Publish) -> bytes:
    """Publish at QoS 1 on a topic `raw` subscribes to: its PUBACK and its own copy come in
    either order; returns the copy's payload."""
    raw.send(p)
    first, second = raw.recv(), raw.recv()
    acks = [x for x in (first, second) if isinstance(x, PubAck)]
    copies = [x for x in (first, second) if isinstance(x, Publish)]
    assert len(acks) == 1 and acks[0].packet_id == p.packet_id, (first, second)
    assert len(copies) == 1, (first, second)
    if copies[0].qos == 1:
        raw.send(PubAck(copies[0].packet_id or 0))
    return copies[0].payload


# ---- test_client_topic_alias ---------------------------------------------------------------


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_client_topic_alias_0_gets_0x94(mesh: MeshInfo, qos: int) -> None:
    raw = connected(mesh.node(0), uid("alias0"), keepalive_s=0)
    pid = 1 if qos else None
    raw.send(
        Publish(uid("alias/t"), b"x", qos, packet_id=pid, properties=Properties(topic_alias=0))
    )
    disconnected_with(raw, 0x94)  # [MQTT-3.3.2-8] Topic Alias invalid (section 3.3.2.3.4)


def test_client_topic_alias_above_maximum_gets_0x94(mesh: MeshInfo) -> None:
    raw, ack = connect(mesh.node(1), uid("aliasmax"))
    over = (ack.properties.topic_alias_maximum or 0) + 1
    raw.send(Publish(uid("alias/t"), b"x", 1, packet_id=1, properties=Properties(topic_alias=over)))
    disconnected_with(raw, 0x94)  # [MQTT-3.3.2-9]


def test_client_topic_aliases_end_with_the_connection(mesh: MeshInfo) -> None:
    """Aliases belong to a network connection, not to the session [MQTT-3.3.2-7]: resumed,
    the session keeps its subscription but an alias set before is unknown (0x82)."""
    cid, topic = uid("aliasconn"), uid("alias/t")
    props = Properties(topic_alias_maximum=0, session_expiry_interval=600)
    raw = connected(mesh.node(0), cid, props=props)
    subscribe(raw, Subscription(topic, 1))
    alias = Properties(topic_alias=1)
    assert echoed(raw, Publish(topic, b"1", 1, packet_id=1, properties=alias)) == b"1"
    assert echoed(raw, Publish("", b"2", 1, packet_id=2, properties=alias)) == b"2"
    raw.send(Disconnect())
    again, ack = connect(mesh.node(1), cid, clean_start=False)
    assert ack.session_present
    assert echoed(again, Publish(topic, b"3", 1, packet_id=3)) == b"3"  # subscription kept
    again.send(Publish("", b"4", 1, packet_id=4, properties=alias))
    disconnected_with(again, 0x82)  # S3.3.2.3.4: an alias with no mapping is a Protocol Error


# ---- test_shared_subscriptions -------------------------------------------------------------


@pytest.mark.parametrize("nodes", [(0, 0), (0, 1)], ids=["one-node", "two-nodes"])
def test_shared_subscriptions_qos0_two_members(mesh: MeshInfo, nodes: tuple[int, int]) -> None:
    """Both members subscribe to the shared filter and a plain topic in one SUBSCRIBE (QoS 2,
    as the suite does); a QoS 0 message on the plain topic reaches both, every QoS 0 message
    on the shared one exactly one member [S4.8.2]."""
    shared, plain = uid("paho/x"), uid("paho/TopicA")
    members = [connected(mesh.node(n), uid("member"), keepalive_s=0) for n in nodes]
    for m in members:
        ack = subscribe(m, Subscription(f"$share/sharename/{shared}", 2), Subscription(plain, 2))
        assert ack.reason_codes == (2, 2)
    pub = members[1]
    pub.send(Publish(plain, b"to both", 0))
    assert [next_publish(m).payload for m in members] == [b"to both", b"to both"]
    sent = [str(i).encode() for i in range(20)]
    for payload in sent:
        pub.send(Publish(shared, payload, 0))
    got: list[bytes] = []

    def all_taken() -> bool:
        for m in members:
            with contextlib.suppress(TimeoutError):
                got.append(next_publish(m).payload if m.pending else _poll(m))
        return len(got) >= len(sent)

    holds_within(all_taken, 10, every_s=0)  # settling: the assert below compares
    pub.send(Publish(plain, END, 0))
    got += [p for m in members for p in payloads_until_end(m)]  # a late copy shows here
    assert sorted(got) == sorted(sent)  # each message to one member, none lost


def _poll(raw: Raw) -> bytes:
    pkt = raw.recv(timeout=0.1)
    assert isinstance(pkt, Publish), pkt
    return pkt.payload


# ---- test_will_delay -----------------------------------------------------------------------


def _dying(
    mesh: MeshInfo, cid: str, topic: str, payload: bytes, delay_s: int, expiry_s: int
) -> Raw:
    will = Will(topic, payload, 1, properties=Properties(will_delay_interval=delay_s))
    props = Properties(session_expiry_interval=expiry_s)
    return connected(mesh.node(0), cid, will=will, props=props, keepalive_s=0)


def _watcher(mesh: MeshInfo, topic: str) -> Raw:
    watcher = connected(mesh.node(1), uid("watch"))
    subscribe(watcher, Subscription(topic, 1))
    return watcher


@pytest.mark.parametrize(
    ("delay_s", "expiry_s"),
    [(2, 30), (600, 1), (600, 0)],
    ids=["delay-first", "session-ends-first", "no-session"],
)
def test_will_delay_published_at_delay_or_session_end(
    mesh: MeshInfo, delay_s: int, expiry_s: int
) -> None:
    """Published after the Will Delay Interval or when the session ends, whichever comes
    first [MQTT-3.1.3-9]: a 600 s delay with a session that ends sooner is published (the
    read below gives up after 10 s)."""
    topic = uid("will/delay")
    watcher = _watcher(mesh, topic)
    _dying(mesh, uid("dying"), topic, b"gone", delay_s, expiry_s).close()
    assert next_publish(watcher).payload == b"gone"


def test_will_delay_reconnect_in_time_cancels_the_will(mesh: MeshInfo) -> None:
    """A client back before its Will Delay Interval passed (resuming its session on the
    other node) has its will never sent [MQTT-3.1.3-9]. Proven without sleeping: the new
    connection's own will, due after the first one would have been, comes alone."""
    cid, topic = uid("back"), uid("will/back")
    watcher = _watcher(mesh, topic)
    _dying(mesh, cid, topic, b"first", 3, 60).close()
    will = Will(topic, b"second", 1, properties=Properties(will_delay_interval=4))
    props = Properties(session_expiry_interval=60)
    back, ack = connect(mesh.node(1), cid, clean_start=False, will=will, props=props)
    assert ack.reason_code == 0 and ack.session_present
    back.close()
    assert next_publish(watcher).payload == b"second"


def test_will_delay_clean_start_in_time_publishes_the_will(mesh: MeshInfo) -> None:
    """A clean start ends the old session, and with it the wait: its will goes at once."""
    cid, topic = uid("fresh"), uid("will/fresh")
    watcher = _watcher(mesh, topic)
    _dying(mesh, cid, topic, b"ended", 600, 600).close()
    _, ack = connect(mesh.node(1), cid, clean_start=True)
    assert ack.reason_code == 0 and not ack.session_present
    assert next_publish(watcher).payload == b"ended"


# ---- test_assigned_clientid / test_zero_length_clientid ------------------------------------


@pytest.mark.parametrize("clean_start", [True, False])
def test_assigned_clientid(mesh: MeshInfo, clean_start: bool) -> None:
    """An empty client id is given one in CONNACK (0x12) [MQTT-3.1.3-7], a new one each
    time, usable as any other; a client that names itself gets none [MQTT-3.2.2-16]."""
    assigned = []
    for node in (0, 1):
        raw = Raw(mesh.node(node))
        ack = raw.connect(Connect("", 5, clean_start=clean_start, keepalive_s=0))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        assert ack.properties.assigned_client_identifier
        assigned.append(ack.properties.assigned_client_identifier)
        topic = uid("assigned/t")
        subscribe(raw, Subscription(topic, 1))
        assert echoed(raw, Publish(topic, b"mine", 1, packet_id=2)) == b"mine"
        raw.send(Disconnect())
    assert assigned[0] != assigned[1]
    _, named = connect(mesh.node(0), uid("named"))
    assert named.properties.assigned_client_identifier is None


def test_zero_length_clientid_mqtt311(mesh: MeshInfo) -> None:
    """3.1.1: an empty id with clean session is accepted; without, refused with return code
    2 [MQTT-3.1.3-8] (CONNACK 0x85 as this codec reads it)."""
    ok = Raw(mesh.node(0), 4).connect(Connect("", 4, clean_start=True, keepalive_s=0))
    assert isinstance(ok, ConnAck) and ok.reason_code == 0
    refused = Raw(mesh.node(0), 4)
    ack = refused.connect(Connect("", 4, clean_start=False, keepalive_s=0))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x85
    assert refused.closed()


# ---- topic matching: the suite's filters and topics, and a long sequence of them -----------

LEVELS = ("TopicA", "B", "C", "", "a b", "x.y")
FILTERS = (
    "#", "+", "+/+", "/+", "/#", "+/+/+", "TopicA/#", "TopicA/+", "+/C", "+/B/#",
    "TopicA/+/#", "TopicA//C", "+//+", "TopicA/B/C", "a b/#", "x.y/+", "TopicA/", "+/+/",
    "//", "/", "+/#", "TopicA/+/",
)  # fmt: skip


def _matches(topic_filter: str, topic: str) -> bool:
    """The matching rule of section 4.7, written independently of the project's trie."""
    f, t = topic_filter.split("/"), topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or level not in ("+", t[i]):
            return False
    return len(f) == len(t)


def test_long_topic_pattern_matching_sequence(mesh: MeshInfo) -> None:
    """Every topic of one to three levels built from the suite's names (empty levels,
    spaces, dots) against every filter: each message carries the identifiers of exactly the
    subscriptions that match it [MQTT-3.3.4-3], across the two nodes."""
    prefix = uid("match")
    topics = sorted(
        {"/".join(p) for n in (1, 2, 3) for p in itertools.product(LEVELS, repeat=n)} - {""}
    )
    sub = connected(mesh.node(1), uid("matcher"))
    for i, f in enumerate(FILTERS, start=1):
        props = Properties(subscription_identifier=(i,))
        assert subscribe(sub, Subscription(f"{prefix}/{f}", 0), pid=i, props=props).reason_codes
    pub = connected(mesh.node(0), uid("matchpub"))
    seen: dict[bytes, set[int]] = {}
    for t in topics:  # one at a time: every topic matches "#", so each brings one message
        pub.send(Publish(f"{prefix}/{t}", t.encode(), 0))
        p = next_publish(sub)
        seen.setdefault(p.payload, set()).update(p.properties.subscription_identifier)
    wrong = [
        t
        for t in topics
        if seen.get(t.encode(), set())
        != {i for i, f in enumerate(FILTERS, start=1) if _matches(f, t)}
    ]
    assert not wrong, [(t, sorted(seen.get(t.encode(), set()))) for t in wrong[:5]]


# ---- the suite's habits: the same ids back to back, twice ----------------------------------


def _paho_round(mesh: MeshInfo, a_id: str, b_id: str, prefix: str) -> None:
    """Steps of the suite with its two client ids: retained messages set and cleared with
    empty payloads, a persistent session resumed then ended, a shared group, a will."""
    topics = [f"{prefix}/{t}" for t in ("TopicA", "TopicA/B", "Topic/C", "TopicA/C")]
    a = connected(mesh.node(0), a_id, keepalive_s=0)  # clean start: whatever was left goes
    for i, t in enumerate(topics[1:], start=1):
        publish_acked(a, Publish(t, b"retained", 1, retain=True, packet_id=i))
    ack = subscribe(a, Subscription(f"{prefix}/+/+", 2))
    assert ack.reason_codes == (2,)
    assert sorted(next_publish(a).topic for _ in range(3)) == sorted(topics[1:])
    for i, t in enumerate(topics[1:], start=1):  # the suite's cleanRetained
        assert echoed(a, Publish(t, b"", 1, retain=True, packet_id=10 + i)) == b""
    a.send(Disconnect())
    props = Properties(session_expiry_interval=600)
    b = connected(mesh.node(1), b_id, props=props, keepalive_s=0)
    subscribe(b, Subscription(f"{prefix}/+/+", 1))  # no retained message left to send
    b.send(Disconnect())
    a = connected(mesh.node(0), a_id, keepalive_s=0)
    publish_acked(a, Publish(topics[3], b"queued", 1, packet_id=1))
    b, ack = connect(mesh.node(0), b_id, clean_start=False, props=props)
    assert ack.session_present and next_publish(b).payload == b"queued"
    b.send(Disconnect(0, Properties(session_expiry_interval=0)))  # the session ends here
    assert b.closed()
    _, ack = connect(mesh.node(1), b_id, clean_start=False)
    assert not ack.session_present
    watcher = connected(mesh.node(1), b_id, keepalive_s=0)
    subscribe(watcher, Subscription(topics[0], 1))
    will = Will(topics[0], b"will", 1, properties=Properties(will_delay_interval=1))
    connected(mesh.node(0), a_id, will=will, props=Properties(session_expiry_interval=5)).close()
    assert next_publish(watcher).payload == b"will"
    watcher.send(Disconnect())


def test_paho_sequence_twice(mesh: MeshInfo) -> None:
    a_id, b_id, prefix = uid("myclientid"), uid("myclientid2"), uid("client_test5")
    for _ in range(2):
        _paho_round(mesh, a_id, b_id, prefix)
