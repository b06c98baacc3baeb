"""The partition suite's mesh (tests/partitions/cluster.py), shared by its cases, which
must each leave it healed; skipped with the reason where namespaces cannot be made. Its
figures go on each case's report, printed as a table at the end of the run (tests/figures.py;
the rows of docs/failure-behaviour.md's "Partitions (multi-host test mesh)" table)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.figures import hand_over
from tests.partitions.cluster import NODES, Cluster, cluster
from tests.partitions.load import Balancer
from tests.partitions.netns import unavailable
from tests.partitions.run import FIGURES
from tests.poll import wait_until


@pytest.fixture(scope="package")
def part_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Nine hosts in network namespaces, the mesh across them, HAProxy in front."""
    reason = unavailable()
    if reason:
        pytest.skip(f"partition suite: {reason}")
    with cluster(tmp_path_factory.mktemp("partitions")) as c:
        lb = Balancer(c.folder / "haproxy.sock")
        wait_until(lambda: lb.up() == set(NODES), 30.0, "both nodes in HAProxy's pool")
        yield c


@pytest.fixture(autouse=True)
def _figures_on_the_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """The figures this case recorded go on its report (tests/figures.py)."""
    before = len(FIGURES)
    yield
    hand_over(request.node, "partition", FIGURES[before:])
