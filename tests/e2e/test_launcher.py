"""`starling up`, `starling status` and `starling restart` as a user runs them: one supervised
mesh for the module. A SIGKILLed rules service comes back by itself (new pid in `status`,
counted, logged) while messages flow through a rule, and every message that got its PUBACK
still goes through the rule; `starling restart rules` restarts it on request; SIGTERM stops
everything, restarted processes included, with no restart on the way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.mesh import Component
from services.cli.ports import free_port
from services.cli.status import component_status
from tests.cli.up_process import Up, alive, running_up, starling
from tests.e2e.clients import Paho
from tests.poll import wait_until

pytestmark = pytest.mark.timeout(300)

COMPONENTS = [
    "nats",
    "redis",
    "session",
    "router",
    "queue",
    "rules",
    "quota",
    "metrics",
    "connection-0",
]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """One supervised mesh; its stop comes right after a child was killed (its restart
    pending, as after a crash): every process must end and none start on the way out."""
    with running_up(tmp_path_factory.mktemp("up")) as u:
        yield u
        os.kill(u.pids()["router"], signal.SIGKILL)
    console = u.console.read_text()
    after_stop = console[console.index("starling up: stopping") :]
    assert "component_restarted" not in after_stop, console


def _rule(up: Up, tag: str) -> None:
    """Republish whatever arrives on in/<tag>/# to out/<tag>/..., QoS 1, as {"p": payload}."""
    action = {"kind": "republish", "params": {"topic": f"out/{tag}/${{topic}}", "qos": "1"}}
    done = starling(
        "rules", "create", f"r-{tag}", "--data-dir", str(up.data_dir),
        "--sql", f'SELECT payload AS p FROM "in/{tag}/#"', "--action", json.dumps(action),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _fires(up: Up, sub: Paho, tag: str, payload: bytes) -> bool:
    """One QoS 1 message through the rule arrives at `sub`."""
    pub = Paho(up.mqtt_port)
    pub.connect()
    try:
        pub.publish(f"in/{tag}/x", payload, qos=1)
        got = sub.expect(1, timeout=30)
        return _text(got[0].payload) == payload.decode()
    finally:
        pub.close()


def _text(output: bytes) -> str:
    """The source payload in a rule's output."""
    return str(json.loads(output)["p"])


def test_status_shows_every_component_the_profile_and_the_supervisor(up: Up) -> None:
    status = up.status()
    assert status.returncode == 0, status.stdout
    lines = status.stdout.splitlines()
    assert [line.split()[0] for line in lines[: len(COMPONENTS)]] == COMPONENTS
    assert all(line.split()[1] == "SERVING" for line in lines[: len(COMPONENTS)])
    assert "profile development" in status.stdout
    assert f"supervised by starling up (pid {up.proc.pid})" in status.stdout
    assert all(alive(p) for p in up.pids().values())


def test_a_killed_rules_service_comes_back_and_loses_no_acknowledged_message(up: Up) -> None:
    """QoS 1 messages flow through a rule; the rules process is SIGKILLed after a quarter of
    them. The supervisor starts it again (new pid, `restarts 1` in status, a line in
    launcher.log), and every message whose PUBACK the publisher got arrives through the rule
    (the killed instance's unacknowledged batch comes back after rules_ack_wait_s, by
    default within seconds)."""
    tag = uuid.uuid4().hex[:8]
    _rule(up, tag)
    sub = Paho(up.mqtt_port)
    sub.connect()
    sub.subscribe(f"out/{tag}/#", qos=1)
    assert _fires(up, sub, tag, b"warm-up")
    old = up.pids()["rules"]
    pub = Paho(up.mqtt_port)
    pub.connect()
    sent: dict[int, bytes] = {}
    for i in range(400):
        info = pub.c.publish(f"in/{tag}/m", f"m{i}".encode(), qos=1)
        sent[info.mid] = f"m{i}".encode()
        if i == 100:
            os.kill(old, signal.SIGKILL)
        time.sleep(0.005)
    wait_until(lambda: len(pub.pubacks) >= len(sent), 60, "every PUBACK")
    acked = {sent[mid] for mid, rc in pub.pubacks.items() if mid in sent and not rc.is_failure}
    pub.close()
    assert len(acked) == len(sent)

    got: set[bytes] = set()

    def arrived() -> bool:
        while not sub.messages.empty():
            got.add(_text(sub.messages.get().payload).encode())
        return acked <= got

    wait_until(arrived, 40, "every acknowledged message through the rule")
    new = wait_until(lambda: (p := up.pids()["rules"]) != old and p, 30, "a new rules pid")
    line = up.status_of("rules")
    assert line[1:5] == ["SERVING", "pid", str(new), "restarts"] and line[5] == "1", line
    log = up.launcher_log()
    assert "component_exited rules code=-9" in log and "component_restarted rules" in log
    sub.close()


def test_starling_restart_restarts_one_component_on_request(up: Up) -> None:
    tag = uuid.uuid4().hex[:8]
    _rule(up, tag)
    sub = Paho(up.mqtt_port)
    sub.connect()
    sub.subscribe(f"out/{tag}/#", qos=1)
    assert _fires(up, sub, tag, b"before")
    before = up.pids()
    done = starling("restart", "rules", "--data-dir", str(up.data_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    after = up.pids()
    assert after["rules"] != before["rules"] and alive(after["rules"])
    assert not alive(before["rules"])
    assert f"rules restarted (pid {after['rules']}): SERVING" in done.stdout
    assert {n: p for n, p in after.items() if n != "rules"} == {
        n: p for n, p in before.items() if n != "rules"
    }
    assert _fires(up, sub, tag, b"after")
    sub.close()
    unknown = starling("restart", "no-such", "--data-dir", str(up.data_dir))
    assert unknown.returncode == 2 and "no component 'no-such'" in unknown.stdout


def test_restart_without_a_running_up_says_so(tmp_path: Path) -> None:
    mesh = tmp_path / "m"
    mesh.mkdir()
    comp = {"name": "rules", "kind": "service", "pid": 0}
    (mesh / "mesh.json").write_text(
        json.dumps({"data_dir": str(mesh), "components": [comp], "launcher_pid": 0})
    )
    done = starling("restart", "rules", "--data-dir", str(mesh))
    assert done.returncode == 1 and "no `starling up` runs the mesh" in done.stdout


def test_status_asks_the_endpoint_not_only_the_recorded_pid(redis_url: str) -> None:
    """A component started again by hand serves under another pid than the recorded one:
    status says SERVING; with nothing on its port, DOWN."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert component_status(Component("redis", "redis", pid=gone.pid, port=port)) == "SERVING"
    with_nothing = Component("redis", "redis", pid=gone.pid, port=free_port())
    assert component_status(with_nothing) == "DOWN"
