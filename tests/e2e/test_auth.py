"""Authentication, ACLs, tenant isolation and the session admin API, end to end."""

from __future__ import annotations

import uuid

import grpc
import pytest

from starling.session.v1 import session_pb2 as pb
from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until


@pytest.fixture(scope="module")
def admin(mesh: MeshInfo) -> Admin:
    return Admin(mesh)


def _tenant() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("scheme", ["argon2", "bcrypt"])
def test_users_with_password_hashes(mesh: MeshInfo, admin: Admin, scheme: str) -> None:
    tenant = _tenant()
    admin.user(tenant, "alice", "s3cret", scheme)
    ok = Paho(mesh.node(0), username=f"{tenant}/alice", password="s3cret")
    ok.connect()
    ok.close()
    bad = Paho(mesh.node(1), username=f"{tenant}/alice", password="wrong")
    assert int(bad.connect(expect_ok=False).value) == 0x86
    bad311 = Paho(mesh.node(1), v5=False, username=f"{tenant}/alice", password="wrong")
    assert bad311.connect(expect_ok=False).is_failure  # return code 4
    anon = Paho(mesh.node(0))  # tenant without anonymous access, no credentials
    anon.c.username_pw_set(f"{tenant}/nobody", None)
    assert int(anon.connect(expect_ok=False).value) in (0x86, 0x87)
    for c in (bad, bad311, anon):
        c.c.loop_stop()


def test_deleted_user_can_no_longer_connect(mesh: MeshInfo, admin: Admin) -> None:
    tenant = _tenant()
    admin.user(tenant, "bob", "pw")
    Paho(mesh.node(0), username=f"{tenant}/bob", password="pw").connect()
    assert admin.call("DeleteUser", pb.DeleteUserRequest(tenant=tenant, username="bob")).deleted
    again = Paho(mesh.node(0), username=f"{tenant}/bob", password="pw")
    assert int(again.connect(expect_ok=False).value) == 0x86


def test_tenants_never_see_each_other(mesh: MeshInfo, admin: Admin) -> None:
    a, b = _tenant(), _tenant()
    admin.user(a, "u", "pw")
    admin.user(b, "u", "pw")
    sub_a = Paho(mesh.node(0), username=f"{a}/u", password="pw")
    sub_a.connect()
    sub_a.subscribe("#", 1)
    sub_b = Paho(mesh.node(1), username=f"{b}/u", password="pw")
    sub_b.connect()
    sub_b.subscribe("#", 1)
    pub_b = Paho(mesh.node(0), username=f"{b}/u", password="pw", client_id="same-id")
    pub_b.connect()
    pub_a = Paho(mesh.node(1), username=f"{a}/u", password="pw", client_id="same-id")
    pub_a.connect()  # same client id in another tenant: no takeover
    pub_b.publish("shared/name", "for-b", 1)
    pub_a.publish("shared/name", "for-a", 1)
    assert [m.payload for m in sub_a.expect(1)] == [b"for-a"]
    assert [m.payload for m in sub_b.expect(1)] == [b"for-b"]
    sub_a.nothing()
    sub_b.nothing()
    assert pub_b.disconnects.empty()
    for c in (sub_a, sub_b, pub_a, pub_b):
        c.close()


def test_acl_denials(mesh: MeshInfo, admin: Admin) -> None:
    tenant = _tenant()
    admin.user(tenant, "dev", "pw")
    admin.acl(
        tenant,
        ("allow", "pub", "devices/%c/#"),
        ("deny", "pub", "devices/#"),
        ("deny", "pub", "secret/#"),
        ("deny", "sub", "private/#"),
        ("allow", "all", "#"),
    )
    user = {"username": f"{tenant}/dev", "password": "pw"}
    watcher = Paho(mesh.node(1), **user)
    watcher.connect()
    assert int(watcher.subscribe("secret/#", 1)[0].value) == 1
    watcher.subscribe("devices/#", 1)

    v5 = Paho(mesh.node(0), client_id="c1", **user)
    v5.connect()
    assert int(v5.publish("secret/x", "no", 1).value) == 0x87
    assert int(v5.subscribe("private/a", 1)[0].value) == 0x87
    assert int(v5.publish("devices/c1/temp", "mine", 1).value) == 0
    assert int(v5.publish("devices/c2/temp", "not mine", 1).value) == 0x87

    v3 = Paho(mesh.node(0), v5=False, **user)
    v3.connect()
    v3.publish("secret/y", "dropped", 1)  # acknowledged, then dropped
    assert int(v3.subscribe("private/b", 1)[0].value) == 0x80
    assert [m.payload for m in watcher.expect(1)] == [b"mine"]
    watcher.nothing()
    for c in (watcher, v5, v3):
        c.close()


def test_bad_acl_rule_is_an_invalid_argument(admin: Admin) -> None:
    with pytest.raises(grpc.RpcError) as info:
        admin.acl("default", ("allow", "pub", "a/#/b"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rules[0].topic_filter" in info.value.details()


def test_admin_calls_need_the_token(mesh: MeshInfo) -> None:
    stub = Admin(mesh).stub
    with pytest.raises(grpc.RpcError) as info:
        stub.ListClients(pb.ListClientsRequest(tenant="default"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_list_and_kick_clients_across_nodes(mesh: MeshInfo, admin: Admin) -> None:
    tenant = _tenant()
    admin.user(tenant, "k", "pw")
    c = Paho(mesh.node(1), client_id="kick-me", username=f"{tenant}/k", password="pw")
    c.connect()
    listed = admin.call("ListClients", pb.ListClientsRequest(tenant=tenant)).clients
    assert [(x.client_id, x.node_id, x.username) for x in listed] == [
        ("kick-me", "connection-1", "k")
    ]
    assert listed[0].peer_address.startswith("127.0.0.1:")
    assert admin.call("KickClient", pb.KickClientRequest(tenant=tenant, client_id="kick-me")).kicked
    assert int(c.disconnects.get(timeout=10).value) == 0x98
    wait_until(
        lambda: not admin.call("ListClients", pb.ListClientsRequest(tenant=tenant)).clients,
        10,
        "the kicked client unlisted",
    )
    with pytest.raises(grpc.RpcError) as info:
        admin.call("KickClient", pb.KickClientRequest(tenant=tenant, client_id="kick-me"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    c.c.loop_stop()
