"""The per-publish quota check without I/O: the channel's answers to a publish over its
budget (MQTT 5 PUBACK/PUBREC 0x97, QoS 0 dropped, 3.1.1 QoS 1/2 closed), and the buckets'
bookkeeping (tokens of a window lapse with it; a publish takes from every budget or none)."""

from __future__ import annotations

from services.common.connect import ConnectOutcome
from services.common.mqtt import EMPTY, Connect, Decoder, PubAck, Publish, PubRec, encode
from services.connection.budget import LIMITED, UNLIMITED, Bucket, PublishGate
from services.connection.channel import Channel, Close, Route, State
from tests.connection.harness import PLAIN, kinds, written


class FixedGate:
    """Admits the first `n` publishes."""

    limits = None  # no count limits of the tenant
    delivery = None  # no outbound bandwidth budgets

    def __init__(self, n: int) -> None:
        self.left = n
        self.sizes: list[int] = []

    def admit(self, nbytes: int) -> bool:
        self.sizes.append(nbytes)
        self.left -= 1
        return self.left >= 0

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


def gated(
    level: int, gate: FixedGate, acl_allow: bool = True
) -> tuple[Channel, Decoder, list[tuple[str, str]]]:
    asked: list[tuple[str, str]] = []

    def gates(tenant: str, user: str, hooks: object) -> FixedGate:
        asked.append((tenant, user))
        return gate

    ch = Channel(PLAIN, "peer", 0.0, lambda: "auto", gates=gates)
    ch.receive(encode(Connect("c", level, keepalive_s=10, properties=EMPTY), level), 0.0)
    outcome = ConnectOutcome(tenant="t", epoch=1, identity="t/alice", acl_default_allow=acl_allow)
    ch.authenticated(outcome, 0.0)
    assert ch.state is State.CONNECTED
    ch.out.clear()
    return ch, Decoder(level), asked


def test_mqtt5_publishes_over_the_budget_get_0x97_and_are_not_routed() -> None:
    gate = FixedGate(1)
    ch, dec, asked = gated(5, gate)
    assert asked == [("t", "alice")]  # the tenant's and the user's budgets
    data = encode(Publish("a/b", b"12345", 1, packet_id=1), 5)
    data += encode(Publish("a/b", b"x", 1, packet_id=2), 5)
    data += encode(Publish("a/b", b"y", 2, packet_id=3), 5)
    data += encode(Publish("a/b", b"z", 0), 5)
    actions = ch.receive(data, 1.0)
    (route,) = actions
    assert isinstance(route, Route)
    assert [m.payload for m in route.messages] == [b"12345"]  # only the admitted one
    assert gate.sizes[0] == len(b"12345") + len("a/b")
    # Acks not deferred in this config: the admitted one is 0, the others 0x97.
    assert written(ch, dec) == [PubAck(1), PubAck(2, 0x97), PubRec(3, 0x97)]
    assert ch.state is State.CONNECTED


def test_mqtt311_qos0_over_the_budget_is_dropped_and_qos1_closes() -> None:
    gate = FixedGate(0)
    ch, dec, _ = gated(4, gate)
    assert ch.receive(encode(Publish("a", b"x", 0), 4), 1.0) == []  # dropped, no answer
    actions = ch.receive(encode(Publish("a", b"x", 1, packet_id=5), 4), 1.0)
    # No ack: an ack would promise delivery. The connection closes (3.1.1 has no code).
    assert kinds(actions) == ["Close"]
    assert isinstance(actions[0], Close) and actions[0].reason_code == 0x97
    assert written(ch, dec) == []


def test_without_gates_nothing_is_checked() -> None:
    ch = Channel(PLAIN, "peer", 0.0, lambda: "auto")
    ch.receive(encode(Connect("c", 5, keepalive_s=10, properties=EMPTY), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1), 0.0)
    (route,) = ch.receive(encode(Publish("a", b"x", 0), 5), 1.0)
    assert isinstance(route, Route)


def limited(tokens: int, key: str = "messages_per_s", expires: float = 10.0) -> Bucket:
    b = Bucket(("t", "", key), lambda b: None)
    b.state, b.tokens, b.expires = LIMITED, tokens, expires
    b.set_limit(100)
    return b


def test_a_publish_takes_from_every_budget_or_from_none() -> None:
    refused: list[tuple[str, str]] = []
    msgs, size = limited(5), limited(10, "bytes_in_per_s")
    gate = PublishGate(
        tenant="t",
        buckets=((msgs, size),),
        clock=lambda: 1.0,
        on_refused=lambda r, t: refused.append((r, t)),
    )
    assert gate.admit(6)
    assert (msgs.tokens, size.tokens) == (4, 4)
    assert not gate.admit(6)  # bytes short: the message budget keeps its token
    assert (msgs.tokens, size.tokens) == (4, 4)
    assert refused == [("bytes_in_per_s", "t")]
    assert size.refused == 1


def test_tokens_lapse_with_their_window_and_an_empty_bucket_asks() -> None:
    wanted: list[Bucket] = []
    b = limited(50, expires=2.0)
    b.want = wanted.append
    assert b.has(1, 1.5)
    assert not wanted
    assert not b.has(1, 2.0)  # the window ended: its tokens are gone
    assert wanted == [b]


def test_a_new_window_goes_on_credit_until_its_lease_comes_and_the_lease_pays_it() -> None:
    # Far below its limit (100/s, low water 5), a publisher must never be refused: every
    # window starts with no tokens, and the lease for it takes a round trip. (Refusing there
    # dropped the first publishes of every second; at a high limit, flat out, everything.)
    b = limited(50, expires=2.0)

    def want(bucket: Bucket) -> None:
        bucket.asking = True

    b.want = want
    for i in range(b.low):
        assert b.has(1, 2.0 + i / 1000), i  # on credit while the lease is under way
        b.tokens -= 1  # taken (PublishGate inlines Bucket.take)
    assert b.tokens == -b.low
    assert not b.has(1, 2.01)  # the credit is bounded by the low water
    # The lease for the new window pays the debt first (services/connection/quota.py).
    b.asking = False
    b.tokens = min(b.tokens, 0) + 20
    b.expires = 3.0
    assert b.tokens == 20 - b.low
    # A window whose budget is spent cluster-wide gives no credit.
    b.tokens, b.not_before, b.expires, b.asking = 0, 4.0, 4.0, True
    assert not b.has(1, 3.5)


def test_unknown_budgets_admit_and_ask_once_unlimited_ones_never_ask() -> None:
    wanted: list[Bucket] = []

    def want(b: Bucket) -> None:
        b.asking = True
        wanted.append(b)

    b = Bucket(("t", "", "messages_per_s"), want)
    assert b.has(1, 0.0) and b.has(1, 0.0)
    assert wanted == [b]
    b.asking, b.state = False, UNLIMITED
    assert b.has(1000, 0.0)
    assert wanted == [b]


def test_ask_size_follows_demand_within_a_slice() -> None:
    b = limited(0)
    b.set_limit(200)
    b.demand = 3
    assert b.ask_size(10) == 5  # at least a quarter of a slice: no call per message
    b.demand = 10_000
    assert b.ask_size(10) == 20  # at most a slice: nodes share a window


def test_acl_checker_still_runs_before_the_budget() -> None:
    gate = FixedGate(10)
    ch, dec, _ = gated(5, gate, acl_allow=False)  # no rule: every publish is denied
    ch.receive(encode(Publish("a", b"x", 1, packet_id=1), 5), 1.0)
    assert written(ch, dec) == [PubAck(1, 0x87)]
    assert gate.sizes == []  # a refused publish spends no budget


def _gate_channel(scopes: int, tokens: int, size_tokens: int) -> tuple[Channel, list[Bucket]]:
    buckets = []
    for _ in range(scopes):  # the tenant's budgets (and the user's)
        buckets += [limited(tokens), limited(size_tokens, "bytes_in_per_s")]
    pairs = tuple((buckets[i], buckets[i + 1]) for i in range(0, len(buckets), 2))
    gate = PublishGate(tenant="t", buckets=pairs, clock=lambda: 1.0, on_refused=lambda r, t: None)
    ch = Channel(PLAIN, "peer", 0.0, lambda: "auto", gates=lambda t, u, hooks: gate)
    ch.receive(encode(Connect("c", 5, keepalive_s=10, properties=EMPTY), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, identity="t/alice"), 0.0)
    return ch, buckets


def test_a_read_of_many_publishes_is_charged_exactly_and_refused_at_the_same_point() -> None:
    """The publishes of one socket read are counted down from an allowance and charged at
    its end: the buckets end up where publish-by-publish checks leave them, and the
    publishes beyond the budget are refused just the same, whatever the read's size."""
    for scopes in (1, 2):
        for per_read in (1, 2, 3, 20, 60):  # 60 publishes in reads of this many
            # 35 message tokens (low-water 5: asking for more starts below it); the bytes
            # budget has plenty. 60 publishes: 35 go, whatever the reads.
            ch, buckets = _gate_channel(scopes, 35, 10_000)
            data = encode(Publish("a/b", b"x" * 7, 0), 5)
            admitted = 0
            for _ in range(0, 60, per_read):
                for action in ch.receive(data * per_read, 1.0):
                    admitted += len(action.messages) if isinstance(action, Route) else 0
            assert admitted == 35, (scopes, per_read)
            msgs, size = buckets[0], buckets[1]  # the tenant's (refuses first)
            assert (msgs.tokens, size.tokens) == (0, 10_000 - 35 * 10), (scopes, per_read)
            assert (msgs.demand, size.demand) == (60, 35 * 10)  # the refused were asked too
            assert msgs.refused == 25


def test_bytes_run_out_mid_read_the_big_publish_is_refused_the_small_ones_go() -> None:
    ch, (msgs, size) = _gate_channel(1, 1000, 125)  # 125 bytes (payload + topic)
    small, big = Publish("a/b", b"x" * 7, 0), Publish("a/b", b"y" * 100, 0)
    data = b"".join(encode(p, 5) for p in [small, small, big, small, big, small])
    (route,) = ch.receive(data, 1.0)
    assert isinstance(route, Route)
    # 10 + 10 + 103 fit in 125; no other does (the allowance and the bucket agree).
    assert [len(m.payload) for m in route.messages] == [7, 7, 100]
    assert (msgs.tokens, size.tokens) == (997, 2)
