"""Playwright for Python on Debian's Chromium (browsers cannot be downloaded here): one
browser per test module, a page that records every browser console error, sign-in, and
screenshots (into docs/console/, which docs/console.md shows, when STARLING_CONSOLE_SHOTS
names it)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import MeshInfo

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

# Screenshots go to a scratch folder, so a test run changes no tracked file; name the
# documentation's (STARLING_CONSOLE_SHOTS=docs/console) to refresh docs/console.md's images.
SHOTS = Path(
    os.environ.get("STARLING_CONSOLE_SHOTS")
    or Path(tempfile.gettempdir()) / "starling-console-shots"
)
TIMEOUT_MS = 10_000


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium on this machine (scripts/setup.sh installs Debian's)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    path = chromium_path()
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


@dataclass
class Tab:
    """A browser tab on the console that remembers the console errors it saw."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)

    def go(self, path: str) -> Page:
        self.page.goto(self.base + path)
        return self.page

    def sign_in(self, token: str) -> None:
        self.go("/")
        self.page.fill("input[name=token]", token)
        self.page.click("button[type=submit]")

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def text(self) -> str:
        return self.page.locator("body").inner_text()


def open_tab(browser: Browser, mesh: MeshInfo, **context: Any) -> Tab:
    context.setdefault("viewport", {"width": 1200, "height": 800})
    ctx = browser.new_context(**context)
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    tab = Tab(page, f"http://127.0.0.1:{mesh.mesh.by_name('console').port}")
    page.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: tab.errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())  # the confirmations of Kick, Delete, ...
    return tab
