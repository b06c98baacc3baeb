"""The console in a real browser with the operator token: sign-in (and a wrong token
refused), every page without a browser console error (a screenshot of each into
docs/console/), a real paho client kicked, a rule created that fires on a real publish, a
ban that refuses a client, and the audit log of those changes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from services.cli.mesh import Mesh
from services.cli.up import print_endpoints
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.browser import Tab, browser, open_tab  # noqa: F401 - fixture
from tests.console.mesh_admin import add_user, connected, new_tenant
from tests.e2e.clients import Paho
from tests.poll import wait_until

if False:  # typing only
    from playwright.sync_api import Browser


@pytest.fixture(scope="module")
def operator(browser: Browser, mesh: MeshInfo) -> Iterator[Tab]:  # noqa: F811
    tab = open_tab(browser, mesh)
    tab.go("/")
    tab.shot("signin")
    tab.sign_in(ADMIN_TOKEN)
    tab.page.wait_for_url("**/overview")
    yield tab
    tab.page.context.close()


@pytest.fixture(scope="module")
def tenant() -> str:
    return new_tenant("op")


def test_the_console_is_a_component_of_the_mesh(
    mesh: MeshInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    """`starling up` lists it with its http:// URL, and so does mesh.json."""
    console = Mesh.load(mesh.mesh.data_dir).by_name("console")
    assert console.url == f"http://127.0.0.1:{console.port}/" and console.grpc_port
    print_endpoints(mesh.mesh)
    assert f"web console                  {console.url}" in capsys.readouterr().out


def test_wrong_token_is_refused_with_a_message(browser: Browser, mesh: MeshInfo) -> None:  # noqa: F811
    tab = open_tab(browser, mesh)
    tab.sign_in("not-the-token")
    assert "That token is not valid." in tab.text()
    assert not tab.page.context.cookies() or all(
        c["name"] != "starling_console" for c in tab.page.context.cookies()
    )
    tab.go("/clients?tenant=default")  # no session: back to the sign-in form
    assert tab.page.locator("input[name=token][type=password]").count() == 1
    assert tab.errors == []
    tab.page.context.close()


def test_sign_in_sets_a_strict_http_only_expiring_cookie(operator: Tab) -> None:
    [cookie] = [c for c in operator.page.context.cookies() if c["name"] == "starling_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    assert "Overview" in operator.text() and "operator" in operator.text()


def test_kick_disconnects_a_real_client(operator: Tab, mesh: MeshInfo, tenant: str) -> None:
    client = connected(mesh, tenant, "kick-me")
    client.c.reconnect_delay_set(min_delay=60, max_delay=120)  # paho would come back
    try:
        page = operator.go(f"/clients?tenant={tenant}")
        row = page.locator("tr[data-client='kick-me']")
        assert "connection-0" in row.inner_text() and "MQTT 5.0" in row.inner_text()
        operator.shot("clients")
        operator.go(f"/clients/kick-me?tenant={tenant}")
        operator.shot("client")
        operator.go(f"/clients?tenant={tenant}")
        row.get_by_role("button", name="Kick kick-me").click()
        page.wait_for_selector("text=Kicked kick-me")
        rc = client.disconnects.get(timeout=10)
        assert rc.value == 0x98, rc  # Administrative action

        def gone() -> bool:
            operator.go(f"/clients?tenant={tenant}")
            return page.locator("tr[data-client='kick-me']").count() == 0

        wait_until(gone, timeout_s=10, what="the kicked client gone from the list")
    finally:
        client.c.loop_stop()
    assert operator.errors == []


def test_a_rule_created_in_the_console_fires_on_a_real_publish(
    operator: Tab, mesh: MeshInfo, tenant: str
) -> None:
    page = operator.go(f"/rules?tenant={tenant}")
    page.fill("#sql", "SELEC broken")
    page.wait_for_selector("#sql-problem")  # checked as you type
    page.fill("#rule_id", "hot")
    page.fill("#sql", 'SELECT payload.temp AS t FROM "sensors/#" WHERE payload.temp > 30')
    page.wait_for_selector("#sql-ok")
    page.fill("#params", "topic=alerts/hot")
    page.click("#create-rule button[type=submit]")
    page.wait_for_selector("text=Created rule hot")
    assert "enabled" in page.locator("tr[data-rule='hot']").inner_text()
    page.fill("#test-sql", 'SELECT payload.temp AS t FROM "sensors/#" WHERE payload.temp > 30')
    page.fill("#test-payload", '{"temp": 42}')
    page.click("#test-rule button[type=submit]")
    assert json.loads(page.locator("#test-result pre").inner_text()) == {"t": 42}
    operator.shot("rules")
    add_user(mesh, tenant, "u", "pw")
    sub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    sub.connect()
    pub.connect()
    try:
        sub.subscribe("alerts/#", qos=1)
        wait_until(lambda: _fires(pub, sub), timeout_s=20, what="the rule's republish")
    finally:
        sub.close()
        pub.close()

    def counted() -> bool:  # the rules instances report their counters every few seconds
        page = operator.go(f"/rules/hot?tenant={tenant}")
        [matched, passed, *_] = page.locator("#rule-metrics td").all_inner_texts()
        actions = page.locator("#action-metrics tbody").inner_text()
        return int(matched) >= 1 and int(passed) >= 1 and "republish" in actions

    wait_until(counted, timeout_s=20, what="the rule's metrics")
    operator.shot("rule")
    assert operator.errors == []


def test_a_rule_edited_in_place_fires_with_its_new_sql(
    operator: Tab, mesh: MeshInfo, tenant: str
) -> None:
    page = operator.go(f"/rules?tenant={tenant}")
    page.get_by_role("link", name="Edit hot").click()
    assert page.locator("#edit").get_attribute("open") is not None
    page.fill("#edit-sql", "SELECT FROM nowhere")
    page.wait_for_selector("#edit-sql-check #sql-problem")  # checked as you type
    page.fill(
        "#edit-sql", 'SELECT payload.temp * 10 AS t10 FROM "sensors/#" WHERE payload.temp > 30'
    )
    page.wait_for_selector("#edit-sql-check #sql-ok")
    page.fill("#params_0", "topic=alerts/hotter")
    page.fill("#edit-description", "ten times hotter")
    operator.shot("rule-edit")
    page.click("#edit-rule button[type=submit]")
    page.wait_for_selector("text=Saved rule hot")
    assert "alerts/hotter" in page.locator("dl.facts").inner_text()
    sub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    sub.connect()
    pub.connect()
    try:
        sub.subscribe("alerts/#", qos=1)
        wait_until(
            lambda: _fires(pub, sub, "alerts/hotter", {"t10": 310}),
            timeout_s=20,
            what="the edited rule's republish",
        )
    finally:
        sub.close()
        pub.close()
    log = operator.go(f"/audit?tenant={tenant}").locator("#audit").inner_text()
    assert "rule_update" in log
    assert operator.errors == []


def _fires(pub: Paho, sub: Paho, topic: str = "alerts/hot", output: object = None) -> bool:
    pub.publish("sensors/1", json.dumps({"temp": 31}), qos=1)
    try:
        [m] = sub.expect(1, timeout=1.0)
    except Exception:
        return False
    return m.topic == topic and json.loads(m.payload) == (output or {"t": 31})


def test_a_ban_added_in_the_console_refuses_the_client(
    operator: Tab, mesh: MeshInfo, tenant: str
) -> None:
    add_user(mesh, tenant, "u", "pw")
    page = operator.go(f"/access?tenant={tenant}")
    page.select_option("#ban-kind", "client-id")
    page.fill("#ban-value", "banned-one")
    page.fill("#ban-reason", "console test")
    page.fill("#ban-duration", "1h")
    page.click("#add-ban button[type=submit]")
    page.wait_for_selector("text=Banned client-id banned-one")
    assert "console test" in page.locator("tr[data-ban='banned-one']").inner_text()
    operator.shot("access")

    def refused() -> bool:
        c = Paho(mesh.node(0), client_id="banned-one", username=f"{tenant}/u", password="pw")
        rc = c.connect(expect_ok=False)
        c.c.disconnect()
        c.c.loop_stop()
        return bool(rc.is_failure and rc.value == 0x8A)  # Banned

    wait_until(refused, timeout_s=15, what="the banned client refused")
    page = operator.go(f"/access?tenant={tenant}")
    page.locator("tr[data-ban='banned-one']").get_by_role("button", name="Remove").click()
    page.wait_for_selector("text=Removed ban client-id banned-one")
    assert operator.errors == []


def test_a_retained_message_is_shown_and_deleted(
    operator: Tab, mesh: MeshInfo, tenant: str
) -> None:
    add_user(mesh, tenant, "u", "pw")
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    pub.connect()
    pub.publish("status/pump", json.dumps({"on": True}), qos=1, retain=True)
    pub.close()
    page = operator.go(f"/topics?tenant={tenant}&filter=status/%23")
    row = page.locator("tr[data-topic='status/pump']")
    assert "json" in row.inner_text() and '"on": true' in row.inner_text()
    operator.shot("topics")
    row.get_by_role("button", name="Delete").click()
    page.wait_for_selector("text=Deleted the retained message of status/pump")
    operator.go(f"/topics?tenant={tenant}&filter=status/%23")
    assert page.locator("tr[data-topic='status/pump']").count() == 0
    assert operator.errors == []


def test_an_acl_saved_in_the_console_refuses_a_real_publish(
    operator: Tab, mesh: MeshInfo, tenant: str
) -> None:
    page = operator.go(f"/policy?tenant={tenant}")
    page.fill("#acl", "deny publish secret/#\npermit all #")
    page.click("#acl-form button[type=submit]")
    page.wait_for_selector("text=ACL not saved")  # the bad line is named, nothing saved
    assert "line 2" in operator.text()
    page.fill("#acl", "deny publish secret/#\nallow all # user=u")
    page.click("#acl-form button[type=submit]")
    page.wait_for_selector("text=ACL saved (2 rules)")
    page.fill("#limit-max_connections", "500")
    page.click("#limits-form button[type=submit]")
    page.wait_for_selector("text=Quotas saved")
    assert page.locator("#limit-max_connections").input_value() == "500"
    assert page.locator("#acl").input_value() == "deny publish secret/#\nallow all # user=u"
    page.fill("#autosub-filter", "devices/%c/cmd/#")
    page.select_option("#autosub-qos", "1")
    page.click("#autosub-form button[type=submit]")
    page.wait_for_selector("text=Auto-subscription devices/%c/cmd/# added")
    assert "devices/%c/cmd/# QoS 1" in page.locator("#autosubs").inner_text()
    operator.shot("policy")
    add_user(mesh, tenant, "u", "pw")
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    pub.connect()
    try:
        assert pub.publish("secret/x", b"no", qos=1).value == 0x87  # Not authorized
        assert pub.publish("open/x", b"yes", qos=1).value == 0
    finally:
        pub.close()
    assert operator.errors == []


def test_audit_log_shows_the_changes_and_every_page_is_clean(operator: Tab, tenant: str) -> None:
    page = operator.go(f"/audit?tenant={tenant}")
    log = page.locator("#audit").inner_text()
    actions = ("kick", "rule_create", "ban_add", "ban_remove", "retained_delete", "acl_set")
    for action in (*actions, "limits_set", "autosub_add"):
        assert action in log, action
    assert "operator" in log and "127.0.0.1" in log
    operator.shot("audit")
    for path in ("/overview", "/operations", f"/overview?tenant={tenant}"):
        operator.go(path)  # drawn from the sampler's history; overview.png comes from
    assert operator.errors == []  # test_console_operations.py, which samples every second
