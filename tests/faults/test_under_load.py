"""Faults under load: each test restarts one part of a two-node mesh (SIGTERM or SIGKILL)
while three publishers keep publishing and reconnecting, and checks with the checker that
no acknowledged message was lost to a persistent session, no QoS 2 message arrived twice
and each persistent session got every publisher's messages in order.

The load (tests/faults/harness.py): QoS 1 publishers on both nodes, a QoS 2 publisher with a
persistent session on node 0, persistent subscribers on both nodes and a clean one on node 0.
A node fault hits node 1, so the QoS 2 publisher keeps its node (QoS 2 across nodes is
test_qos2_publisher_moves_to_another_node).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.cli.launcher import Launcher
from tests.faults.harness import fault_launcher, run_under_load

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    with fault_launcher(tmp_path_factory.mktemp("faults")) as launcher:
        yield launcher


def _restart(launcher: Launcher, name: str, signal: str) -> None:
    pid = launcher.procs[name].pid
    if signal == "SIGTERM":
        launcher.terminate(name)
    else:
        launcher.kill(name)
    launcher.restart(name)
    assert launcher.procs[name].pid != pid


@pytest.mark.parametrize("signal", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("service", ["connection-1", "router", "queue", "session"])
def test_service_restart(launcher: Launcher, service: str, signal: str) -> None:
    run_under_load(
        launcher,
        f"{service} {signal}",
        f"{service} stopped by {signal} and started again",
        lambda: _restart(launcher, service, signal),
    )


def test_redis_restart_loses_its_data(launcher: Launcher) -> None:
    """Redis runs without persistence (launcher: save "" / appendonly no): a restart is a
    restart with every key lost."""
    run_under_load(
        launcher,
        "redis restart",
        "redis-server SIGKILLed and started empty",
        lambda: launcher.restart("redis"),
    )


def test_nats_restart(launcher: Launcher) -> None:
    run_under_load(
        launcher,
        "nats restart",
        "nats-server SIGKILLed and started again",
        lambda: launcher.restart("nats"),
    )
