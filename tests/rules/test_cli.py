"""`starling rules ...` against the shared mesh, as an operator runs it (the token from the file
`starling up` wrote): a rule's life cycle, SQL errors with their position, testing SQL on a
sample, and a webhook's dead letters listed, replayed once the target recovers, and purged.
The commands run in this process (tests/cli/in_process.py), one in a process of its own."""

from __future__ import annotations

import json
import uuid

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.e2e.test_cli import starling, starling_process
from tests.poll import wait_until
from tests.rules.test_e2e import TENANT
from tests.rules.webhook import Webhook


def ok(mesh: MeshInfo, *args: str) -> dict:  # type: ignore[type-arg]
    out = starling(mesh, "rules", *args, "--tenant", TENANT)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_rule_life_cycle_and_errors(mesh: MeshInfo) -> None:
    rid = f"cli-{uuid.uuid4().hex[:6]}"
    action = json.dumps({"kind": "republish", "params": {"topic": "out/${topic}", "qos": 1}})
    made = ok(
        mesh, "create", rid, "--sql", 'SELECT payload.t AS t FROM "cli/#"', "--action", action
    )
    assert made["rule_id"] == rid and made["enabled"] is True
    assert made["actions"] == [
        {"kind": "republish", "params": {"topic": "out/${topic}", "qos": "1"}}
    ]
    assert rid in [r["rule_id"] for r in ok(mesh, "list")["rules"]]
    assert ok(mesh, "disable", rid)["enabled"] is False
    assert ok(mesh, "enable", rid)["enabled"] is True
    shown = ok(mesh, "show", rid)
    assert shown["rule"]["sql"] == 'SELECT payload.t AS t FROM "cli/#"'
    assert "metrics" in shown
    assert ok(mesh, "delete", rid) == {"deleted": True}
    assert ok(mesh, "delete", rid) == {"deleted": False}

    # A process of its own: the rules commands' run through the installed entry point.
    bad = starling_process(
        mesh,
        "rules",
        "create",
        rid,
        "--tenant",
        TENANT,
        "--sql",
        'SELECT x FROM "a"\nWHERE (',
    )
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stdout and "line 2" in bad.stdout
    missing = starling(mesh, "rules", "show", "no-such-rule", "--tenant", TENANT)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stdout
    # A rule id that names nothing is not "no dead letters" (a typo must not look fine).
    letters = starling(mesh, "rules", "dlq", "list", "no-such-rule", "--tenant", TENANT)
    assert letters.returncode == 1 and "NOT_FOUND" in letters.stdout


def test_test_command_runs_sql_against_a_sample(mesh: MeshInfo) -> None:
    got = ok(
        mesh,
        "test",
        "--sql",
        "SELECT upper(payload.name) AS n, user_properties['k'] AS k FROM \"a/+\" WHERE qos = 1",
        "--topic",
        "a/b",
        "--payload",
        '{"name": "x"}',
        "--qos",
        "1",
        "--user-property",
        "k=v",
    )
    assert got["matched"] and got["passed"] and json.loads(got["output"]) == {"n": "X", "k": "v"}
    dropped = ok(mesh, "test", "--sql", 'SELECT * FROM "a/+" WHERE qos = 1', "--topic", "a/b")
    assert dropped["passed"] is False and dropped["matched"] is True


def test_dead_letters_list_replay_purge(mesh: MeshInfo, webhook: Webhook) -> None:
    rid = f"dlq-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:6]
    action = json.dumps({"kind": "http", "params": {"url": webhook.url}})
    ok(mesh, "create", rid, "--sql", f'SELECT payload FROM "dlq/{tag}/#"', "--action", action)
    webhook.status = 400  # permanent: straight to the dead letters
    pub = Paho(mesh.node(0), username=f"{TENANT}/dev-{tag}")
    pub.connect()
    # The rule applies once the node heard of it: publish until the first letter shows.
    wait_until(
        lambda: (
            pub.c.publish(f"dlq/{tag}/probe", b"probe", qos=1) is not None
            and ok(mesh, "dlq", "list", rid)["count"] > 0
        )
    )
    for i in range(3):
        pub.c.publish(f"dlq/{tag}/x", f"m{i}".encode(), qos=1).wait_for_publish(10)

    def letters() -> list[dict]:  # type: ignore[type-arg]
        return ok(mesh, "dlq", "list", rid, "--limit", "1000")["letters"]  # type: ignore[no-any-return]

    wait_until(lambda: {"m0", "m1", "m2"} <= {d["payload"] for d in letters()})
    first = letters()[0]
    assert first["action"] == "0" and "400" in first["error"] and first["topic"].startswith("dlq/")

    webhook.status = 200  # the target recovered
    one = ok(mesh, "dlq", "replay", rid, "--ids", str(first["id"]))
    assert one["delivered"] == 1 and webhook.bodies == [first["payload"].encode()]
    rest = ok(mesh, "dlq", "replay", rid)
    assert rest["delivered"] >= 3 and ok(mesh, "dlq", "list", rid)["letters"] == []
    assert {b"m0", b"m1", b"m2"} <= set(webhook.bodies)

    webhook.status = 400
    pub.c.publish(f"dlq/{tag}/x", b"again", qos=1).wait_for_publish(10)
    wait_until(lambda: ok(mesh, "dlq", "list", rid)["count"] == 1)
    assert ok(mesh, "dlq", "purge", rid) == {"purged": 1}
    assert ok(mesh, "dlq", "list", rid)["count"] == 0
    ok(mesh, "delete", rid)
    pub.close()
