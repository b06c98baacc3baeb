"""`starling up` as a user runs it, in a process of its own, for the tests of the launcher,
its supervision and its profiles: start, read mesh.json and `starling status`, stop with
SIGTERM and check that no process it ever started (restarted ones included) is left. The
other commands (`status`, `restart`, ...) run in the test's process (tests/cli/in_process.py):
`up` is the status/up family's run through the installed entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.cli.in_process import STARLING, starling_in_process
from tests.poll import wait_until

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def starling(*args: str) -> subprocess.CompletedProcess[str]:
    """`starling ARGS` (never `up`: that one is `running_up`'s process) run in this process
    (tests/cli/in_process.py); paths in ARGS are absolute, as the folder it runs in differs."""
    return starling_in_process(*args)


@dataclass
class Up:
    proc: subprocess.Popen[str]
    data_dir: Path
    mqtt_port: int
    console: Path  # what `starling up` printed (stdout and stderr)
    seen_pids: set[int] = field(default_factory=set)  # every child pid mesh.json ever named

    def pids(self) -> dict[str, int]:
        mesh = json.loads((self.data_dir / "mesh.json").read_text())
        found = {c["name"]: c["pid"] for c in mesh["components"]}
        self.seen_pids |= {p for p in found.values() if p}
        return found

    def status(self) -> subprocess.CompletedProcess[str]:
        return starling("status", "--data-dir", str(self.data_dir))

    def status_of(self, name: str) -> list[str]:
        """`starling status`'s line for `name`, split: name, state, "pid", pid, ..."""
        for line in self.status().stdout.splitlines():
            if line.split()[:1] == [name]:
                return line.split()
        raise AssertionError(f"{name} not in status")

    def launcher_log(self) -> str:
        path = self.data_dir / "logs" / "launcher.log"
        return path.read_text() if path.exists() else ""


@contextmanager
def running_up(
    tmp: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 120
) -> Iterator[Up]:
    """`starling up --data-dir <tmp>/mesh --mqtt-port 0 ARGS`, serving; stopped (SIGTERM) on
    exit, which must end it with status 0 and leave none of its processes behind. Port 0:
    the launcher picks every port itself (`mqtt_port` is read back from mesh.json), so none
    of them can collide with one this process picked and has not bound yet."""
    data_dir = tmp / "mesh"
    port = 0
    console = tmp / "up-console.txt"
    with console.open("w") as out:
        proc = subprocess.Popen(
            [*STARLING, "up", "--data-dir", str(data_dir), "--mqtt-port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    up = Up(proc=proc, data_dir=data_dir, mqtt_port=port, console=console)
    try:
        wait_until(
            lambda: (
                proc.poll() is not None
                or ((data_dir / "mesh.json").exists() and up.status().returncode == 0)
            ),
            timeout_s,
            "starling up serving",
        )
        assert proc.poll() is None, console.read_text()
        up.pids()
        mesh = json.loads((data_dir / "mesh.json").read_text())
        up.mqtt_port = next(c["port"] for c in mesh["components"] if c["name"] == "connection-0")
        yield up
        up.pids()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        left = [p for p in up.seen_pids if alive(p)]
        assert not left, f"processes left after stop: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
