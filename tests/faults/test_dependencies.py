"""Start-up without Redis (services/common/dependencies.py): a service process started while
Redis is down waits for it, NOT_SERVING, and serves once Redis is back, instead of exiting
(which an orchestrator answers with a restart back-off that outlasts a short outage)."""

from __future__ import annotations

import pytest

from services.cli.launcher import Launcher
from services.cli.status import component_status
from tests.poll import holds_within

pytestmark = pytest.mark.timeout(120)

NEED_REDIS = ("session", "quota", "queue")


def test_services_started_while_redis_is_down_wait_for_it(fault_mesh: Launcher) -> None:
    launcher = fault_mesh
    launcher.kill("redis")
    for name in NEED_REDIS:
        launcher.kill(name)
        launcher.restart(name, wait=False)
    comps = [launcher.mesh.by_name(n) for n in NEED_REDIS]

    def exited_or_serving() -> bool:
        return any(
            launcher.procs[c.name].poll() is not None or component_status(c) == "SERVING"
            for c in comps
        )

    # Must not happen while Redis is away: long enough for the first attempts to be refused
    # and retried (backoff 0.1 s, 0.2 s, ...); the asserts below name the culprit.
    holds_within(exited_or_serving, 3.0, every_s=0.2)
    for comp in comps:
        assert launcher.procs[comp.name].poll() is None, f"{comp.name} exited without Redis"
        assert component_status(comp) != "SERVING", f"{comp.name} serves without Redis"
    launcher.restart("redis")
    dead = launcher.until(
        lambda: all(component_status(c) == "SERVING" for c in comps), 30.0, NEED_REDIS
    )
    assert dead is None, f"not serving after Redis came back (exited: {dead})"
    log = (launcher.data_dir / "logs" / "session.log").read_text()
    assert "dependency_unreachable" in log
