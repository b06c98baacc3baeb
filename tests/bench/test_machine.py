"""bench/machine.py: what `make bench` writes in its header and divides CPU per message by."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench.machine import cpu_seconds, git_commit, parse_cpu_model, parse_stat_cpu_ticks

# A real /proc/<pid>/stat line, with a command name that holds a space and a ')'.
STAT = (
    "4242 (we ird) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 "
    "731 129 0 0 20 0 3 0 12345 100000000 2000 18446744073709551615"
)


def test_utime_and_stime_are_read_past_a_command_name_with_spaces_and_parens() -> None:
    assert parse_stat_cpu_ticks(STAT) == 731 + 129


def test_cpu_seconds_of_a_process_grow_with_the_work_it_does() -> None:
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.2


def test_a_process_that_is_gone_has_used_no_cpu() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert cpu_seconds(proc.pid) == 0.0


def test_cpu_model_is_the_first_model_name() -> None:
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n\n"
    assert parse_cpu_model(text + text.replace("7B13", "other")) == "AMD EPYC 7B13"
    assert parse_cpu_model("processor : 0\nHardware : BCM2835\n") == "BCM2835"
    assert parse_cpu_model("") == "unknown CPU"


def test_commit_names_sha_branch_and_uncommitted_changes(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=b", "-c", "user.email=b@x", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q", "-b", "main")
    (tmp_path / "f").write_text("1")
    git("add", "f")
    git("commit", "-qm", "one")
    sha = git("rev-parse", "--short=10", "HEAD")
    (tmp_path / "untracked").write_text("not code of the commit's tree")
    assert git_commit(tmp_path) == f"{sha} (main)"
    (tmp_path / "f").write_text("2")
    assert git_commit(tmp_path) == f"{sha} (main) + uncommitted changes"
