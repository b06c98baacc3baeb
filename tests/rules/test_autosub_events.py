"""Auto-subscriptions and subscription events through a running mesh: a client that never
subscribes still receives what its tenant's auto-subscription names (with `%c` escaped, so a
client id of `#` cannot widen it), added and removed without a restart; and a real client's
SUBSCRIBE/UNSUBSCRIBE reach a webhook through `$events/session_subscribed` /
`session_unsubscribed` rules."""

from __future__ import annotations

import json
import queue
import time
import urllib.request
import uuid
from collections.abc import Iterator

import grpc
import pytest

from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho
from tests.poll import wait_until
from tests.rules.webhook import Webhook

MD = [("authorization", f"Bearer {ADMIN_TOKEN}")]
TENANT = "open"  # anonymous in the test mesh


@pytest.fixture
def rules(mesh: MeshInfo) -> Iterator[pb_grpc.RulesAdminServiceStub]:
    with grpc.insecure_channel(mesh.addr("rules")) as ch:
        yield pb_grpc.RulesAdminServiceStub(ch)


def add(stub: pb_grpc.RulesAdminServiceStub, filt: str, qos: int = 1) -> list[str]:
    req = pb.AddAutoSubscriptionRequest(
        tenant=TENANT, subscription=pb.AutoSubscription(filter=filt, qos=qos)
    )
    return [s.filter for s in stub.AddAutoSubscription(req, metadata=MD).subscriptions]


def connect(mesh: MeshInfo, client_id: str, node: int = 1) -> Paho:
    c = Paho(mesh.node(node), client_id=client_id, username=f"{TENANT}/u-{client_id[-6:]}")
    c.connect()
    return c


def receives(c: Paho, pub: Paho, topic: str, wait_s: float = 0.3) -> bool:
    """Whether `c` gets a message published on `topic` now (within `wait_s`)."""
    body = uuid.uuid4().hex
    pub.publish(topic, body, qos=1)
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            m = c.messages.get(timeout=left)
        except queue.Empty:
            return False
        if m.payload.decode() == body:
            return True
    return False


def test_a_client_that_never_subscribes_receives_its_auto_subscription(
    mesh: MeshInfo, rules: pb_grpc.RulesAdminServiceStub
) -> None:
    tag = uuid.uuid4().hex[:6]
    template = f"auto/{tag}/%c/#"
    assert template in add(rules, template)
    pub = Paho(mesh.node(0), username=f"{TENANT}/pub-{tag}")
    pub.connect()

    # Nodes apply it at connect once they heard of it (a push, milliseconds), and it is in
    # place on the mesh moments after the CONNACK: connect anew until a connection has it.
    def fresh_client_receives() -> bool:
        cid = f"dev-{uuid.uuid4().hex[:8]}"
        c = connect(mesh, cid)
        try:
            return receives(c, pub, f"auto/{tag}/{cid}/cmd")
        finally:
            c.close()

    wait_until(fresh_client_receives)
    c = connect(mesh, f"dev-{tag}")
    wait_until(lambda: receives(c, pub, f"auto/{tag}/dev-{tag}/x"))
    assert not receives(c, pub, f"auto/{tag}/someone-else/x")  # its own id only
    c.close()

    # A client id that is a wildcard gets the escaped level, not every client's topics.
    wild = connect(mesh, "#")
    try:
        wait_until(lambda: receives(wild, pub, f"auto/{tag}/%23/x"))
        assert not receives(wild, pub, f"auto/{tag}/dev-{tag}/x")
    finally:
        wild.close()

    # Removed: clients connecting afterwards no longer get it.
    req = pb.DeleteAutoSubscriptionRequest(tenant=TENANT, filter=template)
    assert rules.DeleteAutoSubscription(req, metadata=MD).deleted

    def fresh_client_does_not() -> bool:
        cid = f"dev-{uuid.uuid4().hex[:8]}"
        c = connect(mesh, cid)
        try:
            return not receives(c, pub, f"auto/{tag}/{cid}/cmd")
        finally:
            c.close()

    wait_until(fresh_client_does_not)
    pub.close()


def test_bad_auto_subscriptions_are_refused_by_name(
    rules: pb_grpc.RulesAdminServiceStub,
) -> None:
    for filt, qos, says in [
        ("a/%x", 0, "unknown placeholder %x"),
        ("a/#/b", 0, "filter:"),
        ("$share/g/a", 0, "shared"),
        ("$SYS/%c", 0, "$ topic"),
        ("a/%c", 3, "qos"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            add(rules, filt, qos)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in (err.value.details() or "")


def _create_event_rule(rules: pb_grpc.RulesAdminServiceStub, rid: str, url: str) -> None:
    """A rule that posts every subscribe and unsubscribe event of TENANT to `url`."""
    rules.CreateRule(
        pb.CreateRuleRequest(
            rule=pb.Rule(
                tenant=TENANT,
                rule_id=rid,
                sql="SELECT clientid, username, event, payload.topic_filter AS f, "
                'payload.qos AS qos FROM "$events/session_subscribed", '
                '"$events/session_unsubscribed"',
                enabled=True,
                actions=[pb.Action(kind="http", params={"url": url})],
            )
        ),
        metadata=MD,
    )


def _exported(port: int, rid: str, name: str, action: str = "") -> float:
    """The value of `name` for rule `rid` (and action index) on the rules service's
    Prometheus endpoint at `port`, -1 when not exported."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    for line in text.decode().splitlines():
        # Counters carry Prometheus's `_total` suffix.
        if not line.startswith((name + "{", name + "_total{")) or f'rule="{rid}"' not in line:
            continue
        if action and f'action="{action}"' not in line:
            continue
        return float(line.rsplit(" ", 1)[1])
    return -1.0


def test_subscribe_and_unsubscribe_events_reach_a_webhook(
    mesh: MeshInfo, rules: pb_grpc.RulesAdminServiceStub, webhook: Webhook
) -> None:
    rid = f"sub-{uuid.uuid4().hex[:6]}"
    _create_event_rule(rules, rid, webhook.url)
    c = Paho(mesh.node(1), username=f"{TENANT}/dev-{rid}")
    c.connect()

    def posted(event: str) -> list[dict[str, object]]:
        bodies = [json.loads(b) for b in list(webhook.bodies)]
        return [b for b in bodies if b.get("clientid") == c.client_id and b["event"] == event]

    # Nodes emit them once they heard a rule reads them: subscribe anew until one arrives.
    n = 0

    def a_subscribe_posted() -> bool:
        nonlocal n
        n += 1
        c.subscribe(f"watch/{rid}/{n}", qos=1)
        return bool(posted("subscribed"))

    wait_until(a_subscribe_posted)
    first = posted("subscribed")[0]
    assert first["f"] == f"watch/{rid}/{first['f'].split('/')[-1]}"  # type: ignore[union-attr]
    assert first["qos"] == 1 and first["username"] == f"dev-{rid}"
    c.c.unsubscribe(f"watch/{rid}/1")
    wait_until(lambda: posted("unsubscribed"))
    [gone] = posted("unsubscribed")
    assert gone["f"] == f"watch/{rid}/1" and gone["username"] == f"dev-{rid}"

    # Per-rule metrics on the rules service's Prometheus endpoint, per action too.
    port = mesh.mesh.by_name("rules").metrics_port

    def exported(name: str, action: str = "") -> float:
        return _exported(port, rid, name, action)

    wait_until(lambda: exported("starling_rules_action_success", "0") >= 2)
    assert exported("starling_rules_matched") >= 2 and exported("starling_rules_failed") == 0
    rules.DeleteRule(pb.DeleteRuleRequest(tenant=TENANT, rule_id=rid), metadata=MD)
    c.close()
