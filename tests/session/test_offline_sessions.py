"""The session admin API's offline sessions (ListSessions, DiscardSession) on a real mesh:
a persistent paho client goes offline with messages queued for it; the operator and its
tenant's token list it with its queue depth, a page at a time; another tenant's token is
refused; a discard ends it as its expiry would (reconnecting finds no session, no queue)."""

from __future__ import annotations

import json

import pytest

from services.cli.main import main as cli
from services.common.rpc.errors import PermissionDeniedError
from services.session.client import SessionAdminClient
from services.session.offline import SessionPage
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.mesh_admin import add_user, new_tenant, run, tenant_token
from tests.e2e.clients import Paho
from tests.poll import wait_until


def _offline(mesh: MeshInfo, tenant: str, client_id: str, queued: int) -> None:
    """`client_id` subscribed to s/# (QoS 1), went offline, and `queued` messages wait."""
    sub = Paho(mesh.node(0), client_id=client_id, username=f"{tenant}/u", password="pw")
    sub.connect(session_expiry=3600)
    sub.subscribe("s/#", qos=1)
    sub.close()
    if queued:
        pub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
        pub.connect()
        for i in range(queued):
            pub.publish(f"s/{i}", b"m", qos=1)
        pub.close()


def _list(mesh: MeshInfo, token: str, tenant: str, **kw: object) -> SessionPage:
    async def go() -> SessionPage:
        c = SessionAdminClient(mesh.addr("session"), token)
        try:
            return await c.list_sessions(tenant, **kw)  # type: ignore[arg-type]
        finally:
            await c.close()

    return run(go)


def _discard(mesh: MeshInfo, tenant: str, client_id: str) -> bool:
    async def go() -> bool:
        c = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            return await c.discard_session(tenant, client_id)
        finally:
            await c.close()

    return run(go)


def test_offline_sessions_listed_with_depth_paged_and_scoped(mesh: MeshInfo) -> None:
    tenant = new_tenant("off")
    add_user(mesh, tenant, "u", "pw")
    _offline(mesh, tenant, "dev-1", queued=3)
    for name in ("dev-2", "dev-3", "other-1"):
        _offline(mesh, tenant, name, queued=0)

    def depth_of_dev1() -> int | None:
        page = _list(mesh, ADMIN_TOKEN, tenant, prefix="dev-1")
        return page.sessions[0].queue_depth if page.sessions else None

    assert wait_until(lambda: depth_of_dev1() == 3, what="dev-1 with 3 queued")
    first = _list(mesh, ADMIN_TOKEN, tenant, prefix="dev", limit=2)
    assert [s.client_id for s in first.sessions] == ["dev-1", "dev-2"]
    assert first.next == "dev-2"
    second = _list(mesh, ADMIN_TOKEN, tenant, prefix="dev", limit=2, after=first.next)
    assert ([s.client_id for s in second.sessions], second.next) == (["dev-3"], "")
    assert all(s.expires_at_ms > s.disconnected_at_ms > 0 for s in first.sessions)

    own = tenant_token(mesh, tenant)
    assert [s.client_id for s in _list(mesh, own, tenant).sessions] == [
        "dev-1",
        "dev-2",
        "dev-3",
        "other-1",
    ]
    stranger = tenant_token(mesh, new_tenant("else"))
    with pytest.raises(PermissionDeniedError):
        _list(mesh, stranger, tenant)


def test_the_cli_lists_and_discards(
    mesh: MeshInfo, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tenant = new_tenant("cli")
    add_user(mesh, tenant, "u", "pw")
    _offline(mesh, tenant, "cli-dev", queued=1)
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", ADMIN_TOKEN)
    where = ["--session-addr", mesh.addr("session"), "--tenant", tenant]
    capsys.readouterr()
    assert cli(["sessions", *where, "--prefix", "cli-"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["client_id"], s["queue_depth"]) for s in listed["sessions"]] == [("cli-dev", 1)]
    assert cli(["session-discard", *where, "--client-id", "cli-dev"]) == 0
    assert json.loads(capsys.readouterr().out) == {"discarded": True}


def test_discard_drops_the_session_and_its_queue(mesh: MeshInfo) -> None:
    tenant = new_tenant("disc")
    add_user(mesh, tenant, "u", "pw")
    _offline(mesh, tenant, "gone", queued=2)
    wait_until(
        lambda: [s.queue_depth for s in _list(mesh, ADMIN_TOKEN, tenant).sessions] == [2],
        what="2 queued for gone",
    )
    assert _discard(mesh, tenant, "gone") is True
    assert _list(mesh, ADMIN_TOKEN, tenant).sessions == ()
    assert _discard(mesh, tenant, "gone") is False

    back = Paho(mesh.node(0), client_id="gone", username=f"{tenant}/u", password="pw")
    back.connect(clean_start=False, session_expiry=3600)
    try:
        assert back.session_present is False
        back.nothing(wait_s=1.0)  # the queued messages went with the session
        assert _discard(mesh, tenant, "gone") is False  # connected: not discarded
    finally:
        back.close()
