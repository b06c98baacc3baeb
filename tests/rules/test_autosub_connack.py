"""Auto-subscriptions are in place when the client gets its CONNACK (docs/rules.md
"Auto-subscription"): a message published on another node right after the CONNACK arrives.

Each round takes a fresh tenant, so the subscriber's node has never announced interest in it
and the publisher's node skips NATS for it until it hears that announcement
(services/connection/interest.py): the CONNACK must wait for it, as a SUBACK does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

from services.common.mqtt import (
    ConnAck,
    Connect,
    Packet,
    PubAck,
    Publish,
    UnsubAck,
    Unsubscribe,
)
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from starling.session.v1 import session_pb2
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Raw

MD = [("authorization", f"Bearer {ADMIN_TOKEN}")]
ROUNDS = 20


@pytest.fixture
def rules(mesh: MeshInfo) -> Iterator[pb_grpc.RulesAdminServiceStub]:
    with grpc.insecure_channel(mesh.addr("rules")) as ch:
        yield pb_grpc.RulesAdminServiceStub(ch)


def _connect(mesh: MeshInfo, node: int, tenant: str, client_id: str) -> Raw:
    raw = Raw(mesh.node(node), level=5)
    ack = raw.connect(Connect(client_id, 5, username=f"{tenant}/u", password=b"pw"))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def _next(raw: Raw, kind: type[Packet], timeout_s: float) -> Packet | None:
    """The next packet of `kind` within `timeout_s` (others are skipped), or None."""
    try:
        while not isinstance(p := raw.recv(timeout=timeout_s), kind):
            pass
    except TimeoutError:
        return None
    return p


def _one_round(mesh: MeshInfo, tenant: str, client_id: str) -> tuple[bool, bool]:
    """Connect on node 0, publish once on node 1 as soon as the CONNACK is in: (the message
    arrived, the client held the auto-subscription)."""
    pub = _connect(mesh, 1, tenant, "pub")
    sub = _connect(mesh, 0, tenant, client_id)
    try:
        pub.send(Publish(f"cmd/{client_id}/go", b"now", qos=1, packet_id=1))
        assert isinstance(_next(pub, PubAck, 5.0), PubAck)
        # Past the mesh interest window (2 s, plus 10%): a missed message stays missed.
        got = _next(sub, Publish, 3.0)
        sub.send(Unsubscribe(1, (f"cmd/{client_id}/#",)))
        unsuback = _next(sub, UnsubAck, 5.0)
        assert isinstance(unsuback, UnsubAck)
        return (isinstance(got, Publish) and got.payload == b"now", unsuback.reason_codes == (0,))
    finally:
        sub.close()
        pub.close()


def test_a_message_published_elsewhere_right_after_the_connack_arrives(
    mesh: MeshInfo, rules: pb_grpc.RulesAdminServiceStub
) -> None:
    admin = Admin(mesh)
    tenants = [f"ac{uuid.uuid4().hex[:8]}" for _ in range(ROUNDS)]
    # Hashing their passwords is most of this test's time: all at once.
    created = [
        admin.stub.CreateUser.future(
            session_pb2.CreateUserRequest(
                tenant=t, username="u", password="pw", credentials=["hash"]
            ),
            metadata=MD,
        )
        for t in tenants
    ]
    for f in created:
        f.result()
    for t in tenants:
        rules.AddAutoSubscription(
            pb.AddAutoSubscriptionRequest(
                tenant=t, subscription=pb.AutoSubscription(filter="cmd/%c/#", qos=1)
            ),
            metadata=MD,
        )
    missed = []
    for i, tenant in enumerate(tenants):
        # The nodes hear of it by a push sent before the answer above; a client that still
        # connected without it held no subscription (so made no announcement): connect anew.
        for attempt in range(10):
            arrived, held = _one_round(mesh, tenant, f"dev{i}-{attempt}")
            if held:
                break
        assert held, "node 0 never applied the auto-subscription"
        if not arrived:
            missed.append(i)
    assert not missed, f"missed in rounds {missed} of {ROUNDS}"
