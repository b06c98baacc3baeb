"""Count limits of the session service on the two-node mesh, with real clients (issue 16):
a tenant's `max_sessions` (persistent sessions, online or offline) and a user's
`max_connections`, both cluster-wide: the refused CONNECT gets CONNACK 0x97 (3.1.1: 3) on
either node, another tenant (or user) is unaffected, and the refusal is counted.
"""

from __future__ import annotations

import uuid

from services.quota.client import Limits
from tests.conftest import MeshInfo
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

V3_SERVER_UNAVAILABLE = 0x88  # 3.1.1 CONNACK 3, as decoded


def _tenant(mesh: MeshInfo, *users: str) -> str:
    tenant = f"q{uuid.uuid4().hex[:8]}"
    for u in users:
        Admin(mesh).user(tenant, u, PASSWORD)
    return tenant


def _persistent(mesh: MeshInfo, node: int, tenant: str, client_id: str) -> tuple[Paho, int]:
    c = Paho(mesh.node(node), client_id=client_id, username=f"{tenant}/dev", password=PASSWORD)
    rc = c.connect(expect_ok=False, clean_start=False, session_expiry=300)
    return c, rc.value


def _check_a_v3_session_is_refused_too(mesh: MeshInfo, tenant: str) -> None:
    v3 = raw_connect(mesh.node(1), f"{tenant}/dev", "fourth-v3", level=4)
    # raw_connect sends clean start: a clean 3.1.1 session is not persistent, so it gets in
    assert connack(v3).reason_code == 0
    v3.close()
    v3 = Paho(
        mesh.node(1),
        "fourth-v3p",
        v5=False,
        username=f"{tenant}/dev",
        password=PASSWORD,
        clean=False,
    )
    assert v3.connect(expect_ok=False).value == V3_SERVER_UNAVAILABLE  # code 3, as Paho names it
    v3.c.loop_stop()


def _check_what_is_not_a_new_session(mesh: MeshInfo, tenant: str) -> None:
    """Connections without a session are not limited; a session coming back is not new.
    It ends then (session expiry 0), freeing its place."""
    plain = Paho(mesh.node(0), username=f"{tenant}/dev", password=PASSWORD)
    plain.connect()
    plain.close()
    back, code = _persistent(mesh, 1, tenant, "s0")
    assert code == 0 and back.session_present
    back.close(session_expiry=0)


def _late(mesh: MeshInfo, tenant: str) -> int:
    """The CONNACK code of one more persistent session; if it got in, it ends at once."""
    c, code = _persistent(mesh, 0, tenant, "late")
    if code:
        c.c.loop_stop()
    else:
        c.close(session_expiry=0)
    return code


def test_max_sessions_counts_offline_sessions_across_nodes(mesh: MeshInfo) -> None:
    tenant = _tenant(mesh, "dev")
    quota(mesh, lambda c: c.set_limits(tenant, Limits(max_sessions=3)))
    clients = []
    for i in range(3):
        c, code = _persistent(mesh, i % 2, tenant, f"s{i}")
        assert code == 0
        clients.append(c)
    clients[0].close()  # offline, its session kept: still counted
    clients[1].close(session_expiry=300)
    for node in (0, 1):
        c, code = _persistent(mesh, node, tenant, f"fourth-{node}")
        assert code == QUOTA_EXCEEDED
        c.c.loop_stop()
    _check_a_v3_session_is_refused_too(mesh, tenant)
    _check_what_is_not_a_new_session(mesh, tenant)
    # A session that ends frees its place (the discard is asynchronous: poll).
    wait_until(lambda: _late(mesh, tenant) == 0, 10, "a CONNACK 0 once a connection was freed")
    # Another tenant is unaffected, and the refusals were counted by the session service.
    other = Paho(mesh.node(0), client_id=f"o-{uuid.uuid4().hex[:6]}")
    assert other.connect(clean_start=False, session_expiry=60).value == 0
    other.close(session_expiry=0)
    assert refusals_metric(mesh, "session", tenant, "max_sessions") >= 3
    for c in clients[2:]:
        c.close(session_expiry=0)


def test_a_users_connection_limit_holds_across_nodes(mesh: MeshInfo) -> None:
    tenant = _tenant(mesh, "dev", "ops")
    quota(mesh, lambda c: c.set_limits(tenant, Limits(max_connections=2), user="dev"))
    devs = []
    for node in (0, 1):
        c = Paho(mesh.node(node), username=f"{tenant}/dev", password=PASSWORD)
        c.connect()
        devs.append(c)
    for node in (0, 1):
        raw = raw_connect(mesh.node(node), f"{tenant}/dev", f"third-{node}")
        assert connack(raw).reason_code == QUOTA_EXCEEDED
        raw.close()
    v3 = raw_connect(mesh.node(0), f"{tenant}/dev", "third-v3", level=4)
    assert connack(v3).reason_code == V3_SERVER_UNAVAILABLE
    v3.close()
    # The tenant's other user is not limited; a takeover of a connected id is no new one.
    ops = [Paho(mesh.node(i % 2), username=f"{tenant}/ops", password=PASSWORD) for i in range(3)]
    for c in ops:
        c.connect()
    again = Paho(mesh.node(1), devs[0].client_id, username=f"{tenant}/dev", password=PASSWORD)
    again.connect()
    devs[1].close()

    def late() -> int:
        raw = raw_connect(mesh.node(0), f"{tenant}/dev", "late")
        code = connack(raw).reason_code
        raw.close()
        return code

    wait_until(lambda: late() == 0, 10, "a CONNACK 0 once a connection was freed")
    assert refusals_metric(mesh, "session", tenant, "max_connections_per_user") >= 3
    for c in [*ops, again]:
        c.close()
