"""The fault suite's mesh, shared by its modules; each test starts on a steady mesh, and its
figures go on its report, printed as a table at the end of the run (tests/figures.py; the
rows of docs/failure-behaviour.md's figures table)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.cli.launcher import Launcher
from tests.faults.harness import FIGURES, fault_launcher, wait_steady
from tests.figures import hand_over


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


@pytest.fixture(autouse=True)
def _figures_on_the_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """The figures this test recorded go on its report (tests/figures.py)."""
    before = len(FIGURES)
    yield
    hand_over(request.node, "fault", FIGURES[before:])
