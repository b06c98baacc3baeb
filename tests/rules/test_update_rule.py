"""UpdateRule through a running mesh: a rule edited in place acts on the next publishes with
its new SQL and action (same id, same creation time), a bad edit changes nothing, an edit
begun from an older version is refused (FAILED_PRECONDITION), an unknown id is NOT_FOUND and
a tenant token cannot edit another tenant's rule."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import grpc
import pytest

from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.mesh_admin import tenant_token
from tests.e2e.clients import Paho
from tests.poll import wait_until

MD = [("authorization", f"Bearer {ADMIN_TOKEN}")]
TENANT = "open"  # anonymous in the test mesh


@pytest.fixture
def rules(mesh: MeshInfo) -> Iterator[pb_grpc.RulesAdminServiceStub]:
    with grpc.insecure_channel(mesh.addr("rules")) as ch:
        yield pb_grpc.RulesAdminServiceStub(ch)


def _rule(rule_id: str, sql: str, topic: str, tenant: str = TENANT) -> pb.Rule:
    action = pb.Action(kind="republish", params={"topic": topic, "qos": "1"})
    return pb.Rule(tenant=tenant, rule_id=rule_id, sql=sql, enabled=True, actions=[action])


def _output(pub: Paho, sub: Paho, topic: str, payload: dict[str, int]) -> object:
    """Publish until the rule's output arrives on `topic`; its JSON (None: nothing yet)."""
    pub.publish("temp/1", json.dumps(payload), qos=1)
    try:
        [m] = sub.expect(1, timeout=1.0)
    except Exception:
        return None
    return json.loads(m.payload) if m.topic == topic else None


def test_an_edited_rule_acts_with_its_new_sql_and_action(
    rules: pb_grpc.RulesAdminServiceStub, mesh: MeshInfo
) -> None:
    rule_id = f"u-{uuid.uuid4().hex[:8]}"
    out1, out2 = f"old/{rule_id}", f"new/{rule_id}"
    created = rules.CreateRule(
        pb.CreateRuleRequest(rule=_rule(rule_id, 'SELECT payload.t AS a FROM "temp/#"', out1)),
        metadata=MD,
    ).rule
    sub = Paho(mesh.node(1), username=f"{TENANT}/s")
    pub = Paho(mesh.node(0), username=f"{TENANT}/p")
    sub.connect()
    pub.connect()
    try:
        sub.subscribe(f"+/{rule_id}", qos=1)
        wait_until(lambda: _output(pub, sub, out1, {"t": 1}) == {"a": 1}, timeout_s=20)
        sql = 'SELECT payload.t * 2 AS b FROM "temp/#" WHERE payload.t > 5'
        updated = rules.UpdateRule(
            pb.UpdateRuleRequest(
                rule=_rule(rule_id, sql, out2), if_updated_at_ms=created.updated_at_ms
            ),
            metadata=MD,
        ).rule
        assert updated.created_at_ms == created.created_at_ms
        assert updated.updated_at_ms > created.updated_at_ms and updated.sql == sql
        wait_until(lambda: _output(pub, sub, out2, {"t": 6}) == {"b": 12}, timeout_s=20)
        pub.publish("temp/1", json.dumps({"t": 1}), qos=1)  # WHERE drops it now
        pub.publish("temp/1", json.dumps({"t": 7}), qos=1)
        [m] = sub.expect(1, timeout=5)
        assert (m.topic, json.loads(m.payload)) == (out2, {"b": 14})
        [listed] = [
            r
            for r in rules.ListRules(pb.ListRulesRequest(tenant=TENANT), metadata=MD).rules
            if r.rule_id == rule_id
        ]
        assert listed.sql == sql and listed.actions[0].params["topic"] == out2
    finally:
        sub.close()
        pub.close()


def test_bad_stale_and_unknown_edits_change_nothing(
    rules: pb_grpc.RulesAdminServiceStub, mesh: MeshInfo
) -> None:
    rule_id = f"u-{uuid.uuid4().hex[:8]}"
    sql = 'SELECT * FROM "a/#"'
    created = rules.CreateRule(
        pb.CreateRuleRequest(rule=_rule(rule_id, sql, "x/y")), metadata=MD
    ).rule
    cases = [
        (_rule(rule_id, 'SELECT *\nFROM "a/#"\nWHERE nope(1)', "x/y"), 0, "INVALID_ARGUMENT"),
        (_rule(rule_id, sql, "x/y"), created.updated_at_ms - 1, "FAILED_PRECONDITION"),
        (_rule("no-such-rule", sql, "x/y"), 0, "NOT_FOUND"),
    ]
    for rule, version, code in cases:
        with pytest.raises(grpc.RpcError) as err:
            rules.UpdateRule(pb.UpdateRuleRequest(rule=rule, if_updated_at_ms=version), metadata=MD)
        assert err.value.code().name == code, err.value.details()
    got = rules.GetRule(pb.GetRuleRequest(tenant=TENANT, rule_id=rule_id), metadata=MD).rule
    assert got.sql == sql and got.updated_at_ms == created.updated_at_ms
    token = tenant_token(mesh, "tnupdate")
    with pytest.raises(grpc.RpcError) as err:
        rules.UpdateRule(
            pb.UpdateRuleRequest(rule=_rule(rule_id, sql, "x/z")),
            metadata=[("authorization", f"Bearer {token}")],
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
