"""The partition suite's mesh (tests/partitions/cluster.py), shared by its cases, which
must each leave it healed; skipped with the reason where namespaces cannot be made. Its
figures are printed as a table at the end of the run (the rows of docs/failure-behaviour.md's
"Partitions (multi-host test mesh)" table)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    w = terminalreporter
    w.section("partition suite figures")
    w.line(
        "| case | sent | acked | lost (persistent) | QoS 2 duplicates | QoS 1 duplicates "
        "| clean lost | two nodes at once | longest PUBACK gap | longest gap persistent / clean "
        "| reaction | back after heal | connected, not in the registry, after heal |"
    )
    w.line("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in FIGURES:
        w.line(
            f"| {f['case']} | {f['sent']} | {f['acked']} | {f['lost']} | {f['qos2_duplicates']} "
            f"| {f['qos1_duplicates']} | {f['clean_lost']} | {f['two_nodes']} "
            f"| {f['max_ack_gap_s']} s | {f['max_persistent_gap_s']} s / {f['max_clean_gap_s']} s "
            f"| {f['reaction']}{'; ' + f['note'] if 'note' in f else ''} | {f['back_s']} s "
            f"| {len(f['registry_misses'])} |"
        )
