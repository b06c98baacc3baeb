"""`starling up` and `starling status` as a user runs them, checked by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.cli.ports import free_port

STARLING = [sys.executable, "-m", "services.cli.main"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _status(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STARLING, "status", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _poll(cond, timeout_s: float = 60):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_up_serves_everything_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    data_dir = tmp_path / "mesh"
    up = subprocess.Popen(
        [*STARLING, "up", "--data-dir", str(data_dir), "--mqtt-port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _poll(lambda: (data_dir / "mesh.json").exists() and _status(data_dir).returncode == 0)
        status = _status(data_dir)
        names = [line.split()[0] for line in status.stdout.splitlines()]
        assert names == [
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
        assert all(line.split()[1] == "SERVING" for line in status.stdout.splitlines())
        mesh = json.loads((data_dir / "mesh.json").read_text())
        pids = {c["name"]: c["pid"] for c in mesh["components"]}
        assert all(_alive(p) for p in pids.values())

        # A crashed child shows as down, and status fails.
        os.kill(pids["router"], signal.SIGKILL)
        down = _poll(lambda: (s := _status(data_dir)).returncode == 1 and s)
        assert "router           DOWN" in down.stdout
        assert "session          SERVING" in down.stdout

        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        for name, pid in pids.items():
            assert not _alive(pid), f"{name} (pid {pid}) still running"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
