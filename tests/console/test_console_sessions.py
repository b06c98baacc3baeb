"""Sessions and queues in a real browser, and the audit of changes made through the admin
APIs directly: a persistent paho client went offline with messages queued for it; the page
lists it with its queue depth, finds it by client-id prefix and discards it (confirmed), after
which reconnecting finds no session and nothing queued; a tenant token sees only its own
tenant's sessions; a change made with the session client module (no console) is in the
console's audit log and its JSON-lines export, and the console's own change is there once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from services.session.client import SessionAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.browser import Tab, browser, open_tab  # noqa: F401 - fixture
from tests.console.mesh_admin import add_user, new_tenant, run, tenant_token
from tests.e2e.clients import Paho
from tests.poll import wait_until

if False:  # typing only
    from playwright.sync_api import Browser


@pytest.fixture(scope="module")
def operator(browser: Browser, mesh: MeshInfo) -> Iterator[Tab]:  # noqa: F811
    tab = open_tab(browser, mesh)
    tab.sign_in(ADMIN_TOKEN)
    tab.page.wait_for_url("**/overview")
    yield tab
    tab.page.context.close()


def _went_offline(mesh: MeshInfo, tenant: str, client_id: str, queued: int) -> None:
    sub = Paho(mesh.node(0), client_id=client_id, username=f"{tenant}/u", password="pw")
    sub.connect(session_expiry=3600)
    sub.subscribe("q/#", qos=1)
    sub.close()
    pub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub.connect()
    for i in range(queued):
        pub.publish(f"q/{i}", b"waiting", qos=1)
    pub.close()


def _depth_shown(tab: Tab, path: str, client_id: str) -> str:
    page = tab.go(path)
    row = page.locator(f"tr[data-session='{client_id}']")
    return row.locator("td.depth").inner_text() if row.count() else ""


def _export(tab: Tab, tenant: str) -> str:
    return tab.page.request.get(f"{tab.base}/audit?format=jsonl&tenant={tenant}").text()


def test_offline_session_listed_searched_and_discarded(operator: Tab, mesh: MeshInfo) -> None:
    tenant = new_tenant("sess")
    add_user(mesh, tenant, "u", "pw")
    _went_offline(mesh, tenant, "meter-7", queued=3)
    _went_offline(mesh, tenant, "valve-1", queued=0)
    path = f"/sessions?tenant={tenant}"
    wait_until(lambda: _depth_shown(operator, path, "meter-7") == "3", what="3 queued shown")
    assert "valve-1" in operator.page.locator("#sessions").inner_text()
    operator.shot("sessions")

    page = operator.go(f"{path}&q=met")
    listed = page.locator("#sessions tbody tr[data-session]")
    assert [listed.nth(i).get_attribute("data-session") for i in range(listed.count())] == [
        "meter-7"
    ]
    page.get_by_role("button", name="Discard meter-7").click()  # the dialog is accepted
    page.wait_for_url("**/sessions?**")
    assert "Discarded the session of meter-7" in operator.text()
    assert page.locator("tr[data-session='meter-7']").count() == 0

    back = Paho(mesh.node(0), client_id="meter-7", username=f"{tenant}/u", password="pw")
    back.connect(clean_start=False, session_expiry=3600)
    try:
        assert back.session_present is False
        back.nothing(wait_s=1.0)  # its queue went with it
    finally:
        back.close()
    assert operator.errors == []


def test_a_tenant_token_sees_only_its_own_sessions(
    browser: Browser,  # noqa: F811
    mesh: MeshInfo,
) -> None:
    mine, theirs = new_tenant("own"), new_tenant("them")
    for t in (mine, theirs):
        add_user(mesh, t, "u", "pw")
    _went_offline(mesh, theirs, "secret-dev", queued=1)
    _went_offline(mesh, mine, "my-dev", queued=1)
    tab = open_tab(browser, mesh)
    try:
        tab.sign_in(tenant_token(mesh, mine))
        tab.page.wait_for_url("**/overview")
        wait_until(lambda: _depth_shown(tab, f"/sessions?tenant={theirs}", "my-dev") == "1")
        assert "secret-dev" not in tab.text()
        assert tab.errors == []
    finally:
        tab.page.context.close()


def test_a_direct_admin_api_change_is_in_the_audit_log(operator: Tab, mesh: MeshInfo) -> None:
    tenant = new_tenant("aud")

    async def direct() -> None:  # the client module, as the CLI would call it
        c = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            await c.create_user(tenant, "api-made", "pw")
            await c.discard_session(tenant, "nobody")
        finally:
            await c.close()

    run(direct)
    page = operator.go(f"/audit?tenant={tenant}")
    log = page.locator("#audit").inner_text()
    assert "SessionAdminService/CreateUser" in log and "username=api-made" in log
    assert "SessionAdminService/DiscardSession" in log and "client_id=nobody" in log
    text = _export(operator, tenant)
    exported = [json.loads(line) for line in text.splitlines() if line.strip()]
    made = [r for r in exported if r["action"] == "SessionAdminService/CreateUser"]
    assert len(made) == 1
    assert made[0]["actor"] == "operator" and made[0]["outcome"] == "ok"
    assert made[0]["address"].startswith("127.0.0.1:") and made[0]["tenant"] == tenant


def test_a_console_change_is_recorded_once(operator: Tab, mesh: MeshInfo) -> None:
    tenant = new_tenant("once")
    add_user(mesh, tenant, "u", "pw")
    _went_offline(mesh, tenant, "dup-1", queued=0)
    path = f"/sessions?tenant={tenant}"
    # Listed once the session service has it offline (the page is a snapshot: reloaded).
    wait_until(lambda: _depth_shown(operator, path, "dup-1") != "", what="dup-1 listed")
    page = operator.page
    page.get_by_role("button", name="Discard dup-1").click()
    page.wait_for_url("**/sessions?**")
    text = _export(operator, tenant)
    actions = [json.loads(line)["action"] for line in text.splitlines() if line.strip()]
    assert actions.count("session_discard") == 1
    assert "SessionAdminService/DiscardSession" not in actions
    assert operator.errors == []
