"""A tenant admin token in the console: it sees and changes its own tenant only, whatever a
URL or a forged form asks for, on every page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.common.bans import Ban, BanKind
from services.common.rpc.errors import PermissionDeniedError
from services.quota.client import QuotaAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.browser import Tab, browser, open_tab  # noqa: F401 - fixture
from tests.console.mesh_admin import connected, new_tenant, run, tenant_token
from tests.e2e.clients import Paho
from tests.poll import wait_until

if False:  # typing only
    from playwright.sync_api import Browser

PAGES = (
    "/overview",
    "/clients",
    "/clients/b-secret-client",
    "/rules",
    "/topics",
    "/policy",
    "/access",
    "/audit",
)


@pytest.fixture(scope="module")
def tenants(mesh: MeshInfo) -> Iterator[tuple[str, str, Paho, Paho]]:
    """Tenant A (whose token signs in) and tenant B, each with one connected client."""
    a, b = new_tenant("ta"), new_tenant("tb")
    ca = connected(mesh, a, "a-own-client")
    cb = connected(mesh, b, "b-secret-client", node=1)
    yield a, b, ca, cb
    ca.close()
    cb.close()


@pytest.fixture(scope="module")
def tab(browser: Browser, mesh: MeshInfo, tenants: tuple[str, str, Paho, Paho]) -> Iterator[Tab]:  # noqa: F811
    t = open_tab(browser, mesh)
    t.sign_in(tenant_token(mesh, tenants[0]))
    t.page.wait_for_url("**/overview")
    yield t
    t.page.context.close()


def test_own_clients_are_listed(tab: Tab, tenants: tuple[str, str, Paho, Paho]) -> None:
    a, _, _, _ = tenants
    page = tab.go("/clients")
    assert page.locator("#own-tenant").inner_text() == a
    assert page.locator("tr[data-client='a-own-client']").count() == 1
    tab.shot("tenant-clients")
    assert tab.errors == []


def test_pages_fit_a_phone(
    browser: Browser,  # noqa: F811
    mesh: MeshInfo,
    tenants: tuple[str, str, Paho, Paho],
) -> None:
    phone = open_tab(browser, mesh, viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.sign_in(tenant_token(mesh, tenants[0]))
    for path in PAGES:
        page = phone.go(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} scrolls sideways ({width} px)"  # wide tables scroll alone
    page = phone.go("/clients")
    assert page.locator("tr[data-client='a-own-client']").count() == 1
    phone.shot("phone-clients")
    assert phone.errors == []
    page.context.close()


def test_no_page_or_url_shows_another_tenants_clients(
    tab: Tab, tenants: tuple[str, str, Paho, Paho]
) -> None:
    a, b, _, _ = tenants
    for path in PAGES:
        for query in (f"?tenant={b}", f"?tenant={b}&q=b-secret", "?tenant=", ""):
            tab.go(path + query)
            text = tab.text()
            assert "b-secret-client" not in text or path == "/clients/b-secret-client", path
            assert b not in text, f"{path}{query} shows tenant {b}"
            assert tab.page.locator("#own-tenant").inner_text() == a
    page = tab.go(f"/clients/b-secret-client?tenant={b}")
    assert "Not connected." in tab.text() and "connection-1" not in tab.text()
    export = page.request.get(f"{tab.base}/audit?format=jsonl&tenant={b}").text()
    assert b not in export
    assert tab.errors == []


def test_a_forged_form_cannot_change_another_tenant(
    tab: Tab, tenants: tuple[str, str, Paho, Paho]
) -> None:
    """A kick and a ban posted with the other tenant's name act on the signed-in tenant."""
    _, b, _, cb = tenants
    page = tab.go("/clients")
    csrf = page.locator("input[name=csrf]").first.input_value()
    for path, form in (
        ("/clients/kick", {"client_id": "b-secret-client"}),
        ("/access/bans", {"kind": "client-id", "value": "b-secret-client", "duration": "1m"}),
    ):
        answer = page.request.post(f"{tab.base}{path}", form={"csrf": csrf, "tenant": b, **form})
        assert answer.ok, answer.status
    assert cb.disconnects.empty(), "the other tenant's client was disconnected"
    log = tab.go("/audit").locator("#audit").inner_text()
    assert "kick" in log and "ban_add" in log and b not in log  # recorded against tenant A
    # Without the session's CSRF token nothing changes, whatever the cookie.
    refused = page.request.post(
        f"{tab.base}/clients/kick", form={"csrf": "forged", "client_id": "a-own-client"}
    )
    assert refused.status == 403
    assert tab.errors == []


def test_a_tenant_manages_its_own_bans(
    tab: Tab, mesh: MeshInfo, tenants: tuple[str, str, Paho, Paho]
) -> None:
    """The tenant's ban list (not another tenant's), a ban that refuses its client, removal."""
    a, b, _, _ = tenants
    other_ban = Ban(kind=BanKind.CLIENT_ID, tenant=b, value="b-banned", reason="b only")
    run(lambda: _operator_ban(mesh, other_ban))
    page = tab.go("/access")
    page.select_option("#ban-kind", "client-id")
    page.fill("#ban-value", "a-banned")
    page.fill("#ban-reason", "tenant test")
    page.fill("#ban-duration", "1h")
    page.click("#add-ban button[type=submit]")
    page.wait_for_selector("text=Banned client-id a-banned")
    row = page.locator("tr[data-ban='a-banned']")
    assert "tenant test" in row.inner_text() and a in row.inner_text()
    assert page.locator("tr[data-ban='b-banned']").count() == 0 and b not in tab.text()
    tab.shot("tenant-access")

    def refused() -> bool:
        c = Paho(mesh.node(0), client_id="a-banned", username=f"{a}/u", password="pw")
        rc = c.connect(expect_ok=False)
        c.c.disconnect()
        c.c.loop_stop()
        return bool(rc.is_failure and rc.value == 0x8A)  # Banned

    wait_until(refused, timeout_s=15, what="the tenant's banned client refused")
    page.locator("tr[data-ban='a-banned']").get_by_role("button", name="Remove").click()
    page.wait_for_selector("text=Removed ban client-id a-banned")
    assert page.locator("tr[data-ban='a-banned']").count() == 0
    assert tab.errors == []


def test_a_tenant_sees_its_quotas_but_cannot_raise_them(tab: Tab) -> None:
    page = tab.go("/policy")
    assert page.locator("#limit-max_connections").get_attribute("readonly") is not None
    assert page.locator("#limits-form button[type=submit]").count() == 0
    csrf = page.locator("input[name=csrf]").first.input_value()
    page.request.post(f"{tab.base}/policy/limits", form={"csrf": csrf, "max_connections": "9"})
    assert tab.go("/policy").locator("#limit-max_connections").input_value() != "9"
    assert "limits_set" in tab.go("/audit").locator("#audit").inner_text()  # refused, recorded
    assert tab.errors == []


async def _operator_ban(mesh: MeshInfo, ban: Ban) -> None:
    c = QuotaAdminClient(mesh.addr("quota"), ADMIN_TOKEN)
    try:
        await c.add_ban(ban, 3600)
    finally:
        await c.close()


def test_a_tenant_token_lists_no_other_tenants_bans(
    mesh: MeshInfo, tenants: tuple[str, str, Paho, Paho]
) -> None:
    """The quota admin API behind the page: the token's own tenant only."""
    a, b, _, _ = tenants

    async def lists(tenant: str) -> list[Ban] | str:
        c = QuotaAdminClient(mesh.addr("quota"), tenant_token(mesh, a))
        try:
            return await c.list_bans(tenant)
        except PermissionDeniedError as exc:
            return exc.code.name
        finally:
            await c.close()

    own = run(lambda: lists(a))
    assert isinstance(own, list) and all(ban.tenant == a for ban in own)
    assert run(lambda: lists(b)) == "PERMISSION_DENIED"
    assert run(lambda: lists("")) == "PERMISSION_DENIED"  # every tenant's: the operator's
