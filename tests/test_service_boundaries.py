"""Services meet only through client modules (docs/architecture.md, ../shared/STYLE.md).

Each package under services/ but `common` (a library) and `cli` (the command) is a
service. A service may import another service's *client modules* only: `client.py` or a
module whose name ends in `_client` (`services/session/token_client.py`). Shared logic
lives in services/common, which imports no service at all (not even a client module: what it
needs of one it takes as a parameter). Every import counts, wherever it is written: inside
functions, under `TYPE_CHECKING`, relative ones.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "services"
NOT_SERVICES = frozenset({"common", "cli"})
LIBRARY = "common"
# the services the checks of `crossings` itself assume
SERVICES_SEEN = frozenset({"connection", "metrics", "queue", "quota", "router", "session"})


@dataclass(frozen=True, slots=True)
class Crossing:
    """One import of another service's module that is not a client module."""

    path: str
    line_no: int
    module: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_no}: imports {self.module}"


def service_names() -> frozenset[str]:
    return frozenset(
        p.name
        for p in SERVICES.iterdir()
        if (p / "__init__.py").is_file() and p.name not in NOT_SERVICES
    )


def is_client_module(name: str) -> bool:
    return name == "client" or name.endswith("_client")


def _imported(node: ast.Import | ast.ImportFrom, package: list[str]) -> list[str]:
    """The dotted names an import statement brings in (for `from m import a`: `m.a`, since
    `a` may be a module; its attributes then count as the module `m`'s)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = package[: len(package) - node.level + 1] if node.level else []
    module = [*base, *(node.module.split(".") if node.module else [])]
    return [".".join([*module, alias.name]) for alias in node.names]


def crossings(source: str, path: str, services: frozenset[str]) -> list[Crossing]:
    """The imports in `source` (the file `path`, relative to the root, under services/) of
    another service's modules that are not client modules."""
    parts = path.removesuffix(".py").split("/")
    own = parts[1]
    package = parts[:-1]  # what a relative import starts from, for `__init__.py` too
    found: list[Crossing] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        for name in _imported(node, package):
            dotted = name.split(".")
            if len(dotted) < 2 or dotted[0] != "services" or dotted[1] == own:
                continue
            if dotted[1] not in services:
                continue
            # `services.quota` alone is the package, not a client module; the library takes
            # nothing from a service
            if own == LIBRARY or len(dotted) == 2 or not is_client_module(dotted[2]):
                found.append(Crossing(path, node.lineno, ".".join(dotted[:3])))
    return found


def checked_files() -> list[Path]:
    """Every module of a service, and of services/common."""
    owners = [*sorted(service_names()), LIBRARY]
    return [f for owner in owners for f in sorted((SERVICES / owner).rglob("*.py"))]


def tree_crossings() -> list[Crossing]:
    services = service_names()
    found: list[Crossing] = []
    for f in checked_files():
        rel = f.relative_to(ROOT).as_posix()
        found.extend(crossings(f.read_text(encoding="utf-8"), rel, services))
    return found


def test_services_meet_only_through_client_modules() -> None:
    found = tree_crossings()
    listed = "\n".join(sorted({str(c) for c in found}))
    assert not found, (
        "a service (or services/common) imports another service's module that is not a "
        "client module; move shared code into services/common or go through the client:\n" + listed
    )


def test_every_service_is_checked() -> None:
    names = service_names()
    assert {"connection", "session", "router", "queue", "quota", "metrics"} <= names
    checked = {f.relative_to(SERVICES).parts[0] for f in checked_files()}
    assert checked == names | {LIBRARY}


def test_finds_every_form_of_a_crossing() -> None:
    source = """
import services.router.core
import services.quota as quota_package
from services.quota.copies import LimitsCopies
from services.quota import watch, client
from ..metrics import core

def later():
    from services.router.core import RouteTable
"""
    found = crossings(source, "services/connection/x.py", SERVICES_SEEN)
    assert [(c.line_no, c.module) for c in found] == [
        (2, "services.router.core"),
        (3, "services.quota"),
        (4, "services.quota.copies"),
        (5, "services.quota.watch"),
        (6, "services.metrics.core"),
        (9, "services.router.core"),
    ]
    assert str(found[0]) == "services/connection/x.py:2: imports services.router.core"


def test_allows_clients_own_modules_and_the_library() -> None:
    source = """
from services.quota.client import QuotaClient
from services.session.token_client import TokenClient
from services.session import client
import services.router.client
from services.connection.channel import Channel
from services.connection import node
from . import admission
from services.common.limits_copies import LimitsCopies
from services.cli import main
"""
    assert crossings(source, "services/connection/x.py", SERVICES_SEEN) == []


def test_the_library_imports_no_service() -> None:
    source = """
from services.queue.client import AppendResult
from services.router.core import RouteResult
from services.common.clock import now_ms
"""
    found = crossings(source, "services/common/bus/x.py", SERVICES_SEEN)
    assert [(c.line_no, c.module) for c in found] == [
        (2, "services.queue.client"),
        (3, "services.router.core"),
    ]
