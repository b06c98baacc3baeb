"""The fault suite's mesh, shared by its modules, and its figures printed as a table at the
end of the run (the rows of docs/failure-behaviour.md's figures table)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.cli.launcher import Launcher
from tests.faults.harness import FIGURES, fault_launcher, wait_steady


@pytest.fixture(scope="package")
def fault_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Two nodes and every service, of the fault suite alone: its tests kill processes, so
    never the session-wide `mesh`."""
    with fault_launcher(tmp_path_factory.mktemp("faults")) as launcher:
        yield launcher


@pytest.fixture(autouse=True)
def _steady_fault_mesh(request: pytest.FixtureRequest) -> None:
    """Each test on the fault suite's mesh starts once every node's lease is fresh (the test
    before may have restarted the session service or Redis, after which a node may still be
    about to fence and shed its clients)."""
    if "fault_mesh" in request.fixturenames:
        wait_steady(request.getfixturevalue("fault_mesh"))


def _back_after(f: dict[str, Any]) -> str:
    """Seconds from a Redis failure until CONNECTs were accepted again, where measured."""
    seconds = f.get("failover_s", f.get("connect_gap_s"))
    return "-" if seconds is None else f"{float(seconds):.1f} s"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    w = terminalreporter
    w.section("fault suite figures")
    w.line(
        "| test | faults injected | sent | acked | delivered | lost | QoS 2 duplicates "
        "| QoS 1 duplicates | order violations | clean subscriber lost | CONNECTs back after |"
    )
    w.line("|---|---|---|---|---|---|---|---|---|---|---|")
    for f in FIGURES:
        w.line(
            f"| {f['test']} | {f['faults']} | {f['sent']} | {f['acked']} | {f['delivered']} "
            f"| {f['lost']} | {f['qos2_duplicates']} | {f['qos1_duplicates']} "
            f"| {f['order_violations']} | {f.get('clean_lost', '-')} | {_back_after(f)} |"
        )
