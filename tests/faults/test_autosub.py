"""Auto-subscriptions of a persistent session when the router is killed: its CONNACK waits
for them to be stored with the session (docs/rules.md "Auto-subscription"), so while the
router is down the CONNECT is refused (the client retries) rather than accepted without them;
once the router is back the client connects, and every QoS 1 message published on the other
node after its CONNACK arrives, while it is connected and while it is away."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

from services.cli.launcher import Launcher
from services.common.mqtt import (
    ConnAck,
    Connect,
    Packet,
    Properties,
    PubAck,
    Publish,
    UnsubAck,
    Unsubscribe,
)
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from tests.e2e.clients import Raw
from tests.poll import wait_until

pytestmark = pytest.mark.timeout(120)
N = 20


@pytest.fixture
def tenant(fault_mesh: Launcher) -> Iterator[str]:
    """A fresh tenant (every tenant is anonymous here) with the auto-subscription
    `cmd/%c/#` at QoS 1."""
    t = f"as{uuid.uuid4().hex[:8]}"
    md = [("authorization", f"Bearer {fault_mesh.admin_token}")]
    with grpc.insecure_channel(f"127.0.0.1:{fault_mesh.mesh.by_name('rules').grpc_port}") as ch:
        stub = pb_grpc.RulesAdminServiceStub(ch)
        stub.AddAutoSubscription(
            pb.AddAutoSubscriptionRequest(
                tenant=t, subscription=pb.AutoSubscription(filter="cmd/%c/#", qos=1)
            ),
            metadata=md,
        )
        yield t
        stub.DeleteAutoSubscription(
            pb.DeleteAutoSubscriptionRequest(tenant=t, filter="cmd/%c/#"), metadata=md
        )


def _port(launcher: Launcher, node: int) -> int:
    return launcher.mesh.by_name(f"connection-{node}").port


def _connect(port: int, tenant: str, client_id: str, persistent: bool) -> tuple[Raw, ConnAck]:
    raw = Raw(port, level=5)
    props = Properties(session_expiry_interval=300) if persistent else Properties()
    ack = raw.connect(Connect(client_id, 5, clean_start=not persistent, username=f"{tenant}/u",
                              properties=props))  # fmt: skip
    assert isinstance(ack, ConnAck)
    return raw, ack


def _next(raw: Raw, kind: type[Packet], timeout_s: float = 5.0) -> Packet | None:
    try:
        while not isinstance(p := raw.recv(timeout=timeout_s), kind):
            pass
    except TimeoutError:
        return None
    return p


def _node_knows_it(port: int, tenant: str) -> bool:
    """A clean client of the tenant on this node holds the auto-subscription (no router
    needed for a clean session)."""
    probe, ack = _connect(port, tenant, "probe", persistent=False)
    try:
        assert ack.reason_code == 0
        probe.send(Unsubscribe(1, ("cmd/probe/#",)))
        unsuback = _next(probe, UnsubAck)
        return isinstance(unsuback, UnsubAck) and unsuback.reason_codes == (0,)
    finally:
        probe.close()


def _publish(pub: Raw, topic: str, first_id: int) -> None:
    for i in range(N):
        pub.send(Publish(topic, b"%d" % i, qos=1, packet_id=first_id + i))
    acks = 0
    while acks < N:
        assert isinstance(_next(pub, PubAck), PubAck), "publish not acknowledged"
        acks += 1


def _received(raw: Raw) -> list[int]:
    got = []
    while len(got) < N and isinstance(p := _next(raw, Publish), Publish):
        got.append(int(p.payload))
        if p.qos:
            raw.send(PubAck(p.packet_id))  # type: ignore[arg-type]
    return sorted(got)


def test_auto_subscriptions_of_a_persistent_session_across_a_router_kill(
    fault_mesh: Launcher, tenant: str
) -> None:
    launcher = fault_mesh
    node0, node1 = _port(launcher, 0), _port(launcher, 1)
    for _ in range(100):  # nodes learn it by a push: moments
        if _node_knows_it(node0, tenant):
            break
    else:
        pytest.fail("node 0 never applied the auto-subscription")

    launcher.kill("router")
    try:
        raw, ack = _connect(node0, tenant, "dev", persistent=True)
        raw.close()
        # Not accepted without its auto-subscription stored with the session.
        assert ack.reason_code == 0x88, ack
    finally:
        launcher.restart("router")

    def accepted() -> Raw | None:
        sub, ack = _connect(node0, tenant, "dev", persistent=True)
        if ack.reason_code == 0:
            return sub
        sub.close()
        return None

    # The client retries, as it should after 0x88, until the nodes reach the new router.
    sub = wait_until(accepted, 30, "a CONNACK 0 from the new router", every_s=0.2)
    pub, _ = _connect(node1, tenant, "pub", persistent=False)
    _publish(pub, "cmd/dev/live", 1)  # right after the CONNACK
    assert _received(sub) == list(range(N))
    sub.close()
    _publish(pub, "cmd/dev/queued", 100)  # while it is away: into its queue
    pub.close()
    back, ack = _connect(node0, tenant, "dev", persistent=True)
    assert ack.session_present and ack.reason_code == 0
    assert _received(back) == list(range(N))
    back.close()
