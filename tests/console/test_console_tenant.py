"""A tenant admin token in the console: it sees and changes its own tenant only, whatever a
URL or a forged form asks for, on every page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import MeshInfo
from tests.console.browser import Tab, browser, open_tab  # noqa: F401 - fixture
from tests.console.mesh_admin import connected, new_tenant, tenant_token
from tests.e2e.clients import Paho

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
