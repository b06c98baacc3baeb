"""The fork server (services/cli/forkserver.py) that test meshes start their services from:
a forked child runs its module with exactly the environment and working directory asked for,
its output in its log, in a session of its own; its exit code (or the signal that killed
it) comes back as `subprocess` reports it; it dies when the process that asked for it dies,
and when the fork server dies. A server of its own per test (never the suite's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.forked import Forked, spawn, start_server
from tests.poll import wait_until

ROOT = Path(__file__).resolve().parent.parent.parent
CHILD = "tests.cli.forked_child"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    path = tmp_path / "fork.sock"
    proc = start_server(path)
    yield str(path), proc
    proc.kill()
    proc.wait()


@pytest.fixture
def server(served: tuple[str, subprocess.Popen[bytes]]) -> str:
    return served[0]


def child(server: str, log: Path, cwd: Path, **env: str) -> Forked:
    return spawn(server=server, module=CHILD, env=env, cwd=str(cwd), log=log)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_child_runs_with_its_environment_and_reports_its_exit_code(
    server: str, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    proc = child(server, log, tmp_path, FORKED_PROBE="p1", FORKED_ACTION="exit3")
    assert proc.wait(timeout=20) == 3
    assert proc.poll() == 3
    seen = log.read_text().split()
    assert seen[:3] == ["seen", "p1", str(tmp_path)]
    assert seen[3] == str(ROOT / "tests" / "cli" / "forked_child.py")  # as `python -m` sets it
    assert int(seen[4]) == proc.pid  # a session of its own
    assert seen[5] == "False"  # nothing of the server's environment
    assert seen[6] == "True"  # SIGPIPE ignored, as Python starts: a closed socket kills no one


def test_a_failing_child_exits_1_with_its_traceback_in_the_log(server: str, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    assert child(server, log, tmp_path, FORKED_ACTION="raise").wait(timeout=20) == 1
    assert "RuntimeError: the child failed" in log.read_text()


def test_kill_and_terminate_report_the_signal(server: str, tmp_path: Path) -> None:
    a = child(server, tmp_path / "a.log", tmp_path)
    b = child(server, tmp_path / "b.log", tmp_path)
    b_log = tmp_path / "b.log"
    wait_until(lambda: b_log.exists() and b_log.read_text().startswith("seen"), 20, "b started")
    assert a.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        a.wait(timeout=0.1)
    a.kill()
    b.terminate()
    assert a.wait(timeout=20) == -signal.SIGKILL
    assert b.wait(timeout=20) == -signal.SIGTERM
    a.kill()  # after the end: nothing to signal, no error


def test_children_die_with_the_process_that_asked_and_with_the_server(
    served: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    server, server_proc = served
    # A process that asks for a child, prints its pid and is then SIGKILLed.
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from services.cli.forked import spawn
        p = spawn(server={server!r}, module={CHILD!r}, env={{}}, cwd={str(tmp_path)!r},
                  log=Path({str(tmp_path / "orphan.log")!r}))
        print(p.pid, flush=True)
        time.sleep(600)
        """
    )
    asker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    assert asker.stdout is not None
    orphan = int(asker.stdout.readline())
    assert alive(orphan)
    asker.kill()
    asker.wait()
    wait_until(lambda: not alive(orphan), 20, "the child of a dead asker to end")

    kept = child(server, tmp_path / "kept.log", tmp_path)
    server_proc.kill()
    wait_until(lambda: not alive(kept.pid), 20, "the child of a dead fork server to end")
    assert kept.wait(timeout=5) < 0
