"""What `make bench` records about the machine and the processes it measures.

The CPython calibration loop, the CPU model and the git commit for the report's header, and
the CPU seconds a process has used (utime + stime from /proc/<pid>/stat), from which the
bench derives CPU per message. Pure parsing lives in functions that take the text, so it can
be checked without a /proc of the right shape.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

LOOP_STEPS = 10_000_000
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def python_loop_seconds(steps: int = LOOP_STEPS, rounds: int = 3) -> float:
    """Best of `rounds` timings of an empty `for` loop of `steps` steps: how fast this machine
    runs CPython right now (the figure issue 14's calibration line carries)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            pass
        best = min(best, time.perf_counter() - start)
    return best


def open_files_to_hard_limit() -> int:
    """Raise this process's open-file limit to its hard limit (brokers started from here
    inherit it: thousands of clients on each side of the socket); returns the limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def parse_stat_cpu_ticks(stat: str) -> int:
    """utime + stime (clock ticks) from the text of /proc/<pid>/stat.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses,
    so the fields are counted from the last ')'; utime and stime are fields 14 and 15.
    """
    rest = stat[stat.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): field n is rest[n - 3].
    return int(rest[11]) + int(rest[12])


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far; 0.0 once it is gone."""
    try:
        return parse_stat_cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / _TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return 0.0


def parse_cpu_model(cpuinfo: str) -> str:
    """The first 'model name' of /proc/cpuinfo's text (x86), else its 'Hardware'/'cpu' line."""
    for key in ("model name", "Hardware", "cpu"):
        for line in cpuinfo.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return "unknown CPU"


def git_commit(root: Path) -> str:
    """'<short sha> (<branch>)' of the checkout, '+ uncommitted changes' when it has some."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = git("rev-parse", "--short=10", "HEAD") or "unknown"
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{sha} ({branch or '?'})" + (" + uncommitted changes" if dirty else "")


@dataclass(frozen=True)
class Machine:
    cores: int
    cpu_model: str
    python: str
    commit: str

    def describe(self) -> str:
        return f"{self.cores} cores, {self.cpu_model}, Python {self.python}, {platform.machine()}"


def this_machine(root: Path) -> Machine:
    try:
        model = parse_cpu_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        model = platform.processor() or "unknown CPU"
    return Machine(os.cpu_count() or 0, model, platform.python_version(), git_commit(root))
