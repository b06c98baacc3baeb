"""ACL attacks from the issue, end to end on the shared mesh: client ids that are wildcards
or contain separators, and publishes that try to reach a denied topic through `$delayed` or a
will."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.security.bystander import beside_a_bystander


@pytest.fixture(scope="module")
def admin(mesh: MeshInfo) -> Admin:
    return Admin(mesh)


def _tenant() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("attacker_id", ["#", "+", "dev-1/x"])
def test_a_wildcard_client_id_does_not_widen_a_per_device_acl(
    mesh: MeshInfo, admin: Admin, attacker_id: str
) -> None:
    beside_a_bystander(mesh.node(0), lambda: _wildcard_client_id_attack(mesh, admin, attacker_id))


def _wildcard_client_id_attack(mesh: MeshInfo, admin: Admin, attacker_id: str) -> None:
    tenant = _tenant()
    admin.user(tenant, "dev", "pw")
    admin.acl(tenant, ("allow", "all", "devices/%c/#"), ("deny", "all", "#"))
    user = {"username": f"{tenant}/dev", "password": "pw"}
    attacker = Paho(mesh.node(0), client_id=attacker_id, **user)
    attacker.connect()
    assert int(attacker.subscribe("devices/#", 1)[0].value) == 0x87
    assert int(attacker.subscribe("devices/+/state", 1)[0].value) == 0x87
    assert int(attacker.subscribe("devices/dev-1/#", 1)[0].value) == 0x87
    victim = Paho(mesh.node(1), client_id="dev-1", **user)
    victim.connect()
    assert int(victim.subscribe("devices/dev-1/#", 1)[0].value) == 1  # its own subtree
    assert int(victim.publish("devices/dev-1/x/state", "private", 1).value) == 0
    assert [m.payload for m in victim.expect(1)] == [b"private"]
    attacker.nothing()
    for c in (attacker, victim):
        c.close()


def test_delayed_publish_and_wills_cannot_reach_a_denied_topic(
    mesh: MeshInfo, admin: Admin
) -> None:
    beside_a_bystander(mesh.node(0), lambda: _denied_topic_attack(mesh, admin))


def _denied_topic_attack(mesh: MeshInfo, admin: Admin) -> None:
    tenant = _tenant()
    admin.user(tenant, "eve", "pw")
    admin.user(tenant, "ops", "pw")
    admin.acl(
        tenant,
        ("deny", "pub", "secret/#"),
        ("allow", "all", "#"),
    )
    watcher = Paho(mesh.node(1), username=f"{tenant}/ops", password="pw")
    watcher.connect()
    watcher.subscribe("secret/#", 1)
    watcher.subscribe("public/#", 1)
    eve = {"username": f"{tenant}/eve", "password": "pw"}
    sender = Paho(mesh.node(0), **eve)
    sender.connect()
    assert int(sender.publish("secret/x", "direct", 1).value) == 0x87
    assert int(sender.publish("$delayed/1/secret/x", "delayed", 1).value) == 0x87
    assert int(sender.publish("$delayed/1/public/x", "fine", 1).value) == 0
    # Wills to the denied topic, directly and through `$delayed`, die with their client.
    for topic in ("secret/will", "$delayed/0/secret/will"):
        doomed = Paho(mesh.node(0), will=(topic, b"will", 1), **eve)
        doomed.connect()
        doomed.c.socket().close()  # no DISCONNECT: the will is due
        doomed.c.loop_stop()
    assert [m.topic for m in watcher.expect(1, timeout=5)] == ["public/x"]
    watcher.nothing(wait_s=2.0)
    for c in (watcher, sender):
        c.close()
