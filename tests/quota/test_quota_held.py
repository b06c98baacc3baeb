"""Limits on what a tenant makes the broker hold, on the two-node mesh with real clients
(issue 16): subscriptions per client (SUBACK 0x97; 3.1.1 0x80), entries per session queue
(`max_queue_depth`: the publisher gets PUBACK 0x97 for what a queue refused and 0 only for
what every queue kept; 3.1.1 publishers are disconnected unacknowledged) and retained
messages. Each limit is the quota service's, held by the enforcing service as a copy that a
change reaches without a restart and that outlives the quota service going down.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from services.cli.main import main as cli
from services.common.mqtt import Publish
from services.quota.client import Limits
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until
from tests.quota.test_quota_mesh import (
    PASSWORD,
    QUOTA_EXCEEDED,
    connack,
    quota,
    raw_connect,
    refusals_metric,
)


def _tenant(mesh: MeshInfo, limits: Limits) -> tuple[str, str]:
    tenant = f"q{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "dev", PASSWORD)
    quota(mesh, lambda c: c.set_limits(tenant, limits))
    return tenant, f"{tenant}/dev"


def _client(mesh: MeshInfo, node: int, user: str, **kw: object) -> Paho:
    return Paho(mesh.node(node), username=user, password=PASSWORD, **kw)  # type: ignore[arg-type]


def _codes(rcs: list[object]) -> list[int]:
    return [rc.value for rc in rcs]  # type: ignore[attr-defined]


def _warm(mesh: MeshInfo, user: str) -> None:
    """A connection on each node: the node asks for the tenant's limits at its CONNECT."""
    for node in (0, 1):
        c = _client(mesh, node, user)
        c.connect()
        c.close()


def test_subscriptions_per_client_follow_the_tenants_quota(mesh: MeshInfo) -> None:
    tenant, user = _tenant(mesh, Limits(max_subscriptions_per_client=3))
    _warm(mesh, user)
    clients = []
    for node in (0, 1):
        c = _client(mesh, node, user)
        c.connect()
        for i in range(3):
            assert _codes(c.subscribe(f"s/{i}", 1)) == [1]
        assert _codes(c.subscribe("s/3", 1)) == [QUOTA_EXCEEDED]
        assert _codes(c.subscribe("s/0", 0)) == [0]  # a filter it holds is no new one
        clients.append(c)
    v3 = _client(mesh, 1, user, v5=False)
    v3.connect()
    for i in range(3):
        v3.subscribe(f"v/{i}", 1)
    assert _codes(v3.subscribe("v/3", 1)) == [0x80]
    v3.close()
    # Raised: the connected clients may hold more, without reconnecting.
    quota(mesh, lambda c: c.set_limits(tenant, Limits(max_subscriptions_per_client=5)))
    wait_until(lambda: _codes(clients[0].subscribe("s/3", 1)) == [1], 5, "the raised limit")
    assert _codes(clients[0].subscribe("s/4", 1)) == [1]
    assert _codes(clients[0].subscribe("s/5", 1)) == [QUOTA_EXCEEDED]
    # Another tenant keeps the node's setting.
    other = Paho(mesh.node(0))
    other.connect()
    for i in range(6):
        assert _codes(other.subscribe(f"o/{i}", 0)) == [0]
    other.close()
    counted = sum(
        refusals_metric(mesh, f"connection-{i}", tenant, "subscriptions_per_client") for i in (0, 1)
    )
    assert counted >= 3
    for c in clients:
        c.close()


@pytest.mark.timeout(120)
def test_a_full_queue_refuses_and_only_acknowledged_messages_arrive(mesh: MeshInfo) -> None:
    tenant, user = _tenant(mesh, Limits(max_queue_depth=5))
    sub = _client(mesh, 0, user, client_id="sleeper")
    sub.connect(clean_start=False, session_expiry=300)
    assert _codes(sub.subscribe("q/#", 1)) == [1]
    sub.close()  # offline: its queue fills
    roomy = _client(mesh, 1, user, client_id="roomy")  # online: its queue drains
    roomy.connect(clean_start=False, session_expiry=300)
    roomy.subscribe("q/#", 1)
    pub = _client(mesh, 1, user)  # the other node
    pub.connect()
    codes = {}
    for i in range(5):
        codes[i] = pub.publish("q/x", f"m{i}", 1).value
    assert list(codes.values()) == [0] * 5
    # The quota service goes down while messages flow: the queue keeps its copy of the limit.
    mesh.launcher.terminate("quota")
    try:
        for i in range(5, 8):
            codes[i] = pub.publish("q/x", f"m{i}", 1).value
    finally:
        mesh.launcher.restart("quota")
    assert [codes[i] for i in range(5, 8)] == [QUOTA_EXCEEDED] * 3
    # 3.1.1 has no refusing PUBACK: the publisher is disconnected, unacknowledged.
    v3 = raw_connect(mesh.node(0), user, "v3-pub", level=4)
    assert connack(v3).reason_code == 0
    v3.send(Publish("q/x", b"v3", 1, packet_id=1))
    assert v3.closed(5)
    assert not v3.pending  # no PUBACK came
    # The subscriber with room got everything; the sleeper gets exactly what was
    # acknowledged (nothing refused sneaks in, nothing acknowledged is missing).
    got = sorted(m.payload.decode() for m in roomy.expect(9))
    assert got == sorted([*(f"m{i}" for i in range(8)), "v3"])
    back = _client(mesh, 1, user, client_id="sleeper")
    back.connect(clean_start=False, session_expiry=300)
    assert [m.payload.decode() for m in back.expect(5)] == [f"m{i}" for i in range(5)]
    back.nothing(0.5)
    # Drained: room again.
    assert pub.publish("q/x", "after", 1).value == 0
    assert back.expect(1)[0].payload == b"after"
    assert refusals_metric(mesh, "queue", tenant, "max_queue_depth") >= 4
    for c in (back, roomy):
        c.close(session_expiry=0)
    pub.close()


def test_retained_messages_follow_the_tenants_quota(mesh: MeshInfo) -> None:
    tenant, user = _tenant(mesh, Limits(max_retained_messages=2, max_retained_bytes=4000))
    pubs = [_client(mesh, node, user) for node in (0, 1)]
    for p in pubs:
        p.connect()
    assert pubs[0].publish("r/a", "1", 1, retain=True).value == 0
    assert pubs[1].publish("r/b", "2", 1, retain=True).value == 0
    assert pubs[1].publish("r/c", "3", 1, retain=True).value == QUOTA_EXCEEDED
    assert pubs[0].publish("r/a", "1bis", 1, retain=True).value == 0  # a replacement
    assert pubs[0].publish("r/b", "x" * 5000, 1, retain=True).value == QUOTA_EXCEEDED  # bytes
    assert pubs[1].publish("r/b", "", 1, retain=True).value == 0  # a delete always goes
    assert pubs[1].publish("r/c", "3", 1, retain=True).value == 0
    sub = _client(mesh, 1, user)
    sub.connect()
    sub.subscribe("r/#", 1)
    assert sorted(m.payload.decode() for m in sub.expect(2)) == ["1bis", "3"]
    sub.nothing(0.3)
    assert refusals_metric(mesh, "router", tenant, "max_retained_messages") >= 1
    assert refusals_metric(mesh, "router", tenant, "max_retained_bytes") >= 1
    for c in (*pubs, sub):
        c.close()


def _sleeper(mesh: MeshInfo, user: str) -> None:
    """The persistent session "sleeper" of `user`, subscribed to q/#, offline: its queue fills."""
    s = _client(mesh, 0, user, client_id="sleeper")
    s.connect(clean_start=False, session_expiry=300)
    assert _codes(s.subscribe("q/#", 1)) == [1]
    s.close()  # offline: its queue fills


def _check_acks_free_the_bytes(pub: Paho, back: Paho) -> None:
    """Acknowledged (paho acks on receipt): the bytes are freed, the next one is queued."""

    def code_once_freed() -> list[int]:
        code = pub.publish("q/x", b"after", 1).value
        return [] if code == QUOTA_EXCEEDED else [code]

    assert wait_until(code_once_freed, 5, "the freed bytes taking a publish") == [0]
    assert back.expect(1)[-1].payload == b"after"


@pytest.mark.timeout(120)
def test_queued_bytes_refuse_past_the_limit_survive_a_queue_crash_and_free_on_ack(
    mesh: MeshInfo,
) -> None:
    """`max_queued_bytes` 5000: an offline session's queue takes four 1000-byte messages (a
    stored entry is the payload plus topic, properties and a little framing, under 1250
    bytes), the fifth and sixth are refused with 0x97; another tenant is not; the count
    survives the queue service being killed; the subscriber gets exactly the acknowledged
    ones and its acks make room again."""
    tenant, user = _tenant(mesh, Limits(max_queued_bytes=5000))
    _, other_user = _tenant(mesh, Limits())
    for u in (user, other_user):
        _sleeper(mesh, u)
    payloads = [bytes([65 + i]) * 1000 for i in range(6)]
    pub = _client(mesh, 1, user)
    pub.connect()
    assert [pub.publish("q/x", p, 1).value for p in payloads] == [0] * 4 + [QUOTA_EXCEEDED] * 2
    other_pub = _client(mesh, 1, other_user)
    other_pub.connect()
    assert [other_pub.publish("q/x", p, 1).value for p in payloads] == [0] * 6
    other_pub.close()
    assert refusals_metric(mesh, "queue", tenant, "max_queued_bytes") == 2
    # Killed and started again: the queue state's bytes are loaded before it serves.
    mesh.launcher.restart("queue")
    pub.close()
    pub = _client(mesh, 1, user)
    pub.connect()
    assert pub.publish("q/x", b"z" * 1000, 1).value == QUOTA_EXCEEDED
    back = _client(mesh, 0, user, client_id="sleeper")
    back.connect(clean_start=False, session_expiry=300)
    assert [m.payload for m in back.expect(4)] == payloads[:4]
    back.nothing(0.5)
    _check_acks_free_the_bytes(pub, back)
    # Lowered at runtime: the queue's copy of the limit follows without a restart.
    quota(mesh, lambda c: c.set_limits(tenant, Limits(max_queued_bytes=100)))
    wait_until(
        lambda: pub.publish("q/x", b"y" * 200, 1).value == QUOTA_EXCEEDED, 5, "the lowered limit"
    )
    back.close(session_expiry=0)
    got = _client(mesh, 0, other_user, client_id="sleeper")
    got.connect(clean_start=False, session_expiry=300)
    assert [m.payload for m in got.expect(6)] == payloads
    got.close(session_expiry=0)
    pub.close()


def _check_a_refused_filter_is_not_held(mesh: MeshInfo, user: str, b: Paho) -> Paho:
    """A refused filter is not held: nothing published to it arrives. Returns the publisher."""
    pub = _client(mesh, 0, user)
    pub.connect()
    pub.publish("b/2", "no", 1)
    pub.publish("b/1", "yes", 1)
    assert [m.payload for m in b.expect(1)] == [b"yes"]
    b.nothing(0.3)
    return pub


def _check_unsubscribe_frees_a_slot_elsewhere(a: Paho, b: Paho) -> None:
    """UNSUBSCRIBE on node 0 frees a slot for node 1."""
    unsubacked = threading.Event()
    a.c.on_unsubscribe = lambda *_: unsubacked.set()
    a.c.unsubscribe("a/3")
    assert unsubacked.wait(5)
    wait_until(lambda: _codes(b.subscribe("b/2", 1)) == [1], 5, "the slot freed on node 1")
    assert _codes(b.subscribe("b/3", 1)) == [QUOTA_EXCEEDED]


def _check_another_tenant_is_not_limited(mesh: MeshInfo) -> None:
    other = Paho(mesh.node(1))
    other.connect()
    for i in range(8):
        assert _codes(other.subscribe(f"o/{i}", 0)) == [0]
    other.close()


def test_tenant_subscriptions_are_counted_across_nodes_and_freed(
    mesh: MeshInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_tenant_subscriptions` 4 with clients on both nodes: the fifth new filter is
    refused wherever it comes from (0x97; 3.1.1 0x80), a filter held already is no new one,
    UNSUBSCRIBE and disconnect give slots back, another tenant is not limited."""
    tenant, user = _tenant(mesh, Limits(max_tenant_subscriptions=4))
    a = _client(mesh, 0, user)
    a.connect()
    assert _codes(a.subscribe("a/1", 1)) == [1]
    assert _codes(a.subscribe("$share/g/a/2", 1)) == [1]  # shared ones count too
    assert _codes(a.subscribe("a/3", 0)) == [0]
    b = _client(mesh, 1, user)
    b.connect()
    assert _codes(b.subscribe("b/1", 1)) == [1]
    assert _codes(b.subscribe("b/2", 1)) == [QUOTA_EXCEEDED]
    assert _codes(a.subscribe("a/4", 1)) == [QUOTA_EXCEEDED]
    assert _codes(a.subscribe("a/1", 0)) == [0]  # held already: re-granted
    v3 = _client(mesh, 1, user, v5=False)
    v3.connect()
    assert _codes(v3.subscribe("v/1", 1)) == [0x80]
    pub = _check_a_refused_filter_is_not_held(mesh, user, b)
    _check_unsubscribe_frees_a_slot_elsewhere(a, b)
    # A disconnect frees what the client held (a/1 and the shared a/2).
    a.close()
    wait_until(lambda: _codes(v3.subscribe("v/1", 1)) == [1], 5, "the slots a disconnect freed")
    assert _codes(v3.subscribe("v/2", 1)) == [1]
    assert _codes(v3.subscribe("v/3", 1)) == [0x80]
    # Raised without a restart, with the CLI.
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", ADMIN_TOKEN)
    cmd = ["quota", "set", "--quota-addr", mesh.addr("quota"), "--tenant", tenant]
    assert cli([*cmd, "--max-tenant-subscriptions", "5"]) == 0
    wait_until(lambda: _codes(v3.subscribe("v/3", 1)) == [1], 5, "the limit the CLI raised")
    assert quota(mesh, lambda c: c.get_limits(tenant)) == Limits(max_tenant_subscriptions=5)
    _check_another_tenant_is_not_limited(mesh)
    counted = sum(
        refusals_metric(mesh, f"connection-{i}", tenant, "max_tenant_subscriptions") for i in (0, 1)
    )
    assert counted >= 4
    for c in (b, v3, pub):
        c.close()


def test_a_resumed_sessions_subscriptions_count_again(mesh: MeshInfo) -> None:
    """Offline, a persistent session's subscriptions are not counted (the documented
    bound); resumed, they count again, so the tenant's other clients get fewer slots."""
    _, user = _tenant(mesh, Limits(max_tenant_subscriptions=3))
    c = _client(mesh, 1, user)
    c.connect()
    assert _codes(c.subscribe("y/1", 1)) == [1]
    p = _client(mesh, 0, user, client_id="keeper")
    p.connect(clean_start=False, session_expiry=300)
    assert _codes(p.subscribe("x/1", 1)) == [1]
    assert _codes(p.subscribe("x/2", 1)) == [1]
    assert _codes(c.subscribe("y/2", 1)) == [QUOTA_EXCEEDED]
    p.close()  # offline: its two filters leave the count
    wait_until(lambda: _codes(c.subscribe("y/2", 1)) == [1], 5, "the offline filters' slots")
    back = _client(mesh, 0, user, client_id="keeper")
    back.connect(clean_start=False, session_expiry=300)  # resumed with x/1, x/2: 4 held
    unsubacked = threading.Event()
    c.c.on_unsubscribe = lambda *_: unsubacked.set()

    def refused_after_unsubscribing() -> bool:
        """Gives y/2 back (3 held if the resumed filters count, 1 if not) and asks again."""
        unsubacked.clear()
        c.c.unsubscribe("y/2")
        assert unsubacked.wait(5)
        return _codes(c.subscribe("y/2", 1)) == [QUOTA_EXCEEDED]

    wait_until(refused_after_unsubscribing, 5, "the resumed filters counted")
    back.close(session_expiry=0)
    c.close()
