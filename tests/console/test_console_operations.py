"""The overview's live charts and the operations page in a real browser, on a mesh of their
own (a node is drained here, and the charts sample every second instead of every ten):

- the operator's overview shows every node and service instance with its health, the
  tenants' message rates and charts that htmx refreshes by itself;
- a tenant token's overview shows its own tenant only, and it gets 403 for operations;
- the pages fit a phone's width;
- a node drained from the operations page, after a keyboard-answered confirmation, shows its
  clients leaving and then its exit, its MQTT 5 clients get DISCONNECT 0x9C, and the drain
  is in the audit log."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from services.cli.mesh import Mesh
from services.rules.admin_client import RulesAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.console.browser import Tab, browser, open_tab  # noqa: F401 - fixture
from tests.console.mesh_admin import add_user, new_tenant, run, tenant_token
from tests.e2e.clients import Paho
from tests.poll import wait_until

if False:  # typing only
    from playwright.sync_api import Browser

pytestmark = pytest.mark.timeout(300)
DRAINED = "connection-1"
CLIENTS_ON_DRAINED = 6


@pytest.fixture(scope="module")
def ops_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshInfo]:
    launcher = Launcher(
        data_dir=tmp_path_factory.mktemp("console-ops") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=False,
        ws=False,
        extra_env={
            "STARLING_ADMIN_TOKEN": ADMIN_TOKEN,
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_STATS_INTERVAL_S": "0.5",
            "STARLING_CONSOLE_SAMPLE_INTERVAL_S": "1",
            # Slow enough that the page shows clients leaving one by one.
            "STARLING_DRAIN_RATE_PER_S": "2",
        },
    )
    m = launcher.start(timeout_s=90)
    yield MeshInfo(m, launcher, Path())
    launcher.stop()


@pytest.fixture(scope="module")
def tenant(ops_mesh: MeshInfo) -> str:
    t = new_tenant("ov")
    add_user(ops_mesh, t, "u", "pw")
    return t


@pytest.fixture(scope="module")
def operator(ops_mesh: MeshInfo, browser: Browser) -> Iterator[Tab]:  # noqa: F811
    # The mesh first: its launcher runs asyncio, which Playwright's running loop forbids.
    tab = open_tab(browser, ops_mesh)
    tab.sign_in(ADMIN_TOKEN)
    tab.page.wait_for_url("**/overview")
    yield tab
    tab.page.context.close()


class Traffic:
    """A publisher and a subscriber of `tenant` on node 0, publishing until stopped."""

    def __init__(self, mesh: MeshInfo, tenant: str) -> None:
        port = mesh.node(0)
        self.sub = Paho(port, username=f"{tenant}/u", password="pw")
        self.pub = Paho(port, username=f"{tenant}/u", password="pw")
        self.sub.connect()
        self.pub.connect()
        self.sub.subscribe("load/#", qos=0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.pub.c.publish("load/x", b"x", 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close()
        self.sub.close()


def _cell(tab: Tab, row: str, column: int) -> str:
    cells = tab.page.locator(row).locator("td")
    return cells.nth(column).inner_text() if cells.count() > column else ""


def _positive(text: str) -> bool:
    try:
        return float(text.replace(",", "")) > 0
    except ValueError:
        return False


def test_operator_overview_shows_every_instance_and_live_rates(
    operator: Tab, ops_mesh: MeshInfo, tenant: str
) -> None:
    services = [c for c in Mesh.load(ops_mesh.mesh.data_dir).components if c.kind == "service"]
    traffic = Traffic(ops_mesh, tenant)
    try:
        page = operator.go("/overview")
        # The live part refreshes itself (htmx): no reload from here on.
        wait_until(
            lambda: _positive(_cell(operator, f"tr[data-tenant='{tenant}']", 2)),
            timeout_s=30,
            what="the tenant's messages in per second",
        )
        assert _positive(_cell(operator, "tr[data-node='connection-0']", 3))  # node in /s
        assert int(_cell(operator, "tr[data-node='connection-0']", 2)) >= 2  # connections
        instances = page.locator("#instance-table tbody tr")
        wait_until(
            lambda: (
                instances.count() == len(services)
                and page.locator("#instance-table .st-serving").count() == len(services)
            ),
            timeout_s=30,
            what="every instance listed as SERVING",
        )
        for c in services:
            assert page.locator(f"tr[data-instance='{c.name}']").count() == 1, c.name
        for chart in ("connections", "messages", "drops", "instances"):
            assert page.locator(f"#cluster-{chart} svg polyline").count() >= 1, chart
        assert "in:" in page.locator("#cluster-messages .legend").inner_text()
        operator.shot("overview")
    finally:
        traffic.stop()
    assert operator.errors == []


def test_a_tenant_sees_its_own_figures_and_no_operations(
    browser: Browser,  # noqa: F811
    ops_mesh: MeshInfo,
    tenant: str,
) -> None:
    other = new_tenant("ox")
    add_user(ops_mesh, other, "u", "pw")
    c = Paho(ops_mesh.node(0), username=f"{other}/u", password="pw")
    c.connect()
    tab = open_tab(browser, ops_mesh)
    try:
        tab.sign_in(tenant_token(ops_mesh, tenant))
        page = tab.go(f"/overview?tenant={other}")
        wait_until(
            lambda: page.locator("#tenant-connections svg polyline").count() >= 1,
            timeout_s=30,
            what="the tenant's own connection chart",
        )
        assert tenant in page.locator("#tenant-head").inner_text()
        assert other not in tab.text()
        for hidden in ("#node-table", "#instance-table", "#tenant-table", "#cluster-head"):
            assert page.locator(hidden).count() == 0, hidden
        assert page.get_by_role("link", name="Operations").count() == 0
        tab.shot("tenant-overview")
        answer = page.request.get(f"{tab.base}/operations")
        assert answer.status == 403 and "connection-" not in answer.text()
        csrf = page.locator("input[name=csrf]").first.input_value()
        drain = page.request.post(
            f"{tab.base}/operations/drain", form={"csrf": csrf, "node": DRAINED}
        )
        assert drain.status == 403
        assert tab.errors == []
    finally:
        tab.page.context.close()
        c.close()


def test_pages_fit_a_phone(browser: Browser, ops_mesh: MeshInfo, tenant: str) -> None:  # noqa: F811
    phone = open_tab(browser, ops_mesh, viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.sign_in(ADMIN_TOKEN)
    for path in (
        "/overview",
        f"/overview?tenant={tenant}",
        "/operations",
        f"/access?tenant={tenant}",
    ):
        page = phone.go(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} scrolls sideways ({width} px)"
        nav = page.evaluate(
            "(() => { const n = document.querySelector('nav');"
            " return n.scrollWidth <= n.clientWidth && n.getBoundingClientRect().right <= 390; })()"
        )
        assert nav, f"{path}: the navigation overflows"
    phone.go("/operations")
    phone.shot("phone-operations")
    assert phone.errors == []
    phone.page.context.close()


UNLABELLED = """[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
    .filter(e => e.labels.length === 0 && !e.getAttribute('aria-label'))
    .map(e => e.name || e.id || e.outerHTML)"""


def test_every_input_has_a_label(operator: Tab, ops_mesh: MeshInfo, tenant: str) -> None:
    run(lambda: _rule(ops_mesh, tenant))
    pages = [
        "/overview",
        "/operations",
        "/audit",
        *(
            f"{p}?tenant={tenant}"
            for p in ("/clients", "/rules", "/rules/labelled", "/topics", "/access", "/policy")
        ),
    ]
    for path in pages:
        page = operator.go(path)
        assert page.evaluate(UNLABELLED) == [], path
    assert operator.errors == []


async def _rule(mesh: MeshInfo, tenant: str) -> None:
    c = RulesAdminClient(mesh.addr("rules"), ADMIN_TOKEN)
    try:
        await c.create(tenant, "labelled", 'SELECT * FROM "a/#"', [("republish", {"topic": "b"})])
    finally:
        await c.close()


def _phase(tab: Tab) -> tuple[str, str]:
    row = tab.page.locator(f"tr[data-node='{DRAINED}']")
    if row.count() == 0:
        return "", ""
    return row.get_attribute("data-phase") or "", row.locator(".clients-left").inner_text()


def test_drain_a_node_from_the_operations_page(
    operator: Tab, ops_mesh: MeshInfo, tenant: str
) -> None:
    clients = [
        Paho(ops_mesh.node(1), username=f"{tenant}/u", password="pw")
        for _ in range(CLIENTS_ON_DRAINED)
    ]
    for c in clients:
        c.c.reconnect_delay_set(min_delay=60, max_delay=120)  # paho would come back
        c.connect()
    asked: list[str] = []
    operator.page.on("dialog", lambda d: asked.append(d.message))
    try:
        page = operator.go("/operations")
        assert _phase(operator) == ("serving", str(CLIENTS_ON_DRAINED))
        page.select_option("#drain-node", DRAINED)
        page.focus("#drain-form button[type=submit]")
        page.keyboard.press("Enter")  # the confirmation answers to the keyboard too
        page.wait_for_selector(f"text=Draining {DRAINED}")
        assert asked and asked[0].startswith(f"Drain {DRAINED}?"), asked
        seen: list[int] = []

        def exited() -> bool:  # the node table refreshes itself
            phase, left = _phase(operator)
            if left.isdigit():
                if not seen:
                    operator.shot("operations-draining")
                seen.append(int(left))
            return phase == "exited"

        wait_until(exited, timeout_s=60, what=f"{DRAINED} drained and exited")
        assert seen and max(seen) > 0, seen  # clients were seen leaving ...
        assert seen == sorted(seen, reverse=True), seen  # ... and none came back
        operator.shot("operations")
        for c in clients:
            rc = c.disconnects.get(timeout=10)
            assert rc.value == 0x9C, rc  # Use another server
        log = operator.go("/audit").locator("#audit").inner_text()
        assert "node_drain" in log and DRAINED in log
    finally:
        for c in clients:
            c.c.loop_stop()
    assert operator.errors == []
