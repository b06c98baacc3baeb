"""The suite's own plumbing: how `make test` hands files to parallel workers
(tests/scheduling.py) and how the fault and partition figures reach the end-of-run tables
from whichever worker ran the test (tests/figures.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import figures
from tests.scheduling import SECONDS, longest_first, unit_of_id

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = ROOT / "Makefile"


class _Item:
    """What longest_first reads of a collected item."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


def test_files_go_out_longest_first() -> None:
    longest = max(SECONDS, key=SECONDS.__getitem__)
    names = ["tests/a/test_x.py::t1", f"{longest}::t1", "tests/a/test_x.py::t2", f"{longest}::t2"]
    items: list[Any] = [_Item(n) for n in names]
    longest_first(items)
    assert [i.nodeid for i in items] == [
        f"{longest}::t1",
        f"{longest}::t2",
        "tests/a/test_x.py::t1",
        "tests/a/test_x.py::t2",
    ]


def test_make_tests_workers_run_each_file_whole() -> None:
    """The Makefile's own pytest options for its parallel phase, on two workers: every test of
    a file runs on the worker that ran the file's first (module fixtures such as a mesh start
    once)."""
    recipe = re.search(r"^\t.*pytest(.* -n \$\(TEST_WORKERS\).*?)\|\|", MAKEFILE.read_text(), re.M)
    assert recipe is not None, "the Makefile's parallel phase"
    options = [o.replace("$(TEST_WORKERS)", "2") for o in shlex.split(recipe.group(1))]
    files = ["tests/common/test_topics.py", "tests/common/test_config.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "-vv", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (tests/\S+?)::", done.stdout, re.M)
    workers = {f: {w for w, g in ran if g == f} for f in files}
    assert all(workers[f] for f in files), done.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers


def _report(when: str, props: list[tuple[str, object]]) -> pytest.TestReport:
    return pytest.TestReport(
        "t.py::x", ("t.py", 1, "x"), {}, "passed", None, when, user_properties=props
    )


class _Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def line(self, text: str) -> None:
        self.lines.append(text)


def test_figures_ride_on_the_teardown_report_to_the_table(monkeypatch: Any) -> None:
    monkeypatch.setattr(figures, "REPORTED", {})
    node: Any = type("Node", (), {"user_properties": []})()
    figures.hand_over(node, "fault", [{"test": "kill", "lost": 0}])
    figures.collect(_report("call", node.user_properties))  # counted once: at teardown
    figures.collect(_report("teardown", node.user_properties))
    out = _Reporter()
    figures.print_table(
        out, "fault", "fault figures", lambda fs: [f"{f['test']}:{f['lost']}" for f in fs]
    )
    figures.print_table(out, "partition", "partition figures", lambda fs: ["never"])
    assert out.lines == ["== fault figures", "kill:0"]


def test_timing_sensitive_files_run_after_the_rest() -> None:
    """`make test` runs the files marked `timed` after the parallel phase, beside each other
    only, and the files marked `alone` last, by themselves; the parallel phase leaves both
    out: each runs exactly once."""
    lines = [ln for ln in MAKEFILE.read_text().splitlines() if "-m pytest" in ln]
    marks = [re.search(r' -m ("[^"]*"|\S+) \|\|', ln) for ln in lines]
    order = [m.group(1).strip('"') if m else "" for m in marks]
    assert order == ["not timed and not alone", "timed", "alone"], lines
    assert "-n $(TEST_WORKERS)" in lines[0] and "--dist loadfile" in lines[1], lines
    assert " -n " not in lines[2], lines


def test_the_partition_suite_is_one_unit() -> None:
    """Its files share a mesh in fixed network namespaces: one worker runs them all."""
    ids = ["tests/partitions/test_partitions.py::a", "tests/partitions/test_takeover.py::b"]
    assert {unit_of_id(i) for i in ids} == {"tests/partitions"}
    assert unit_of_id("tests/faults/test_kills.py::c") == "tests/faults/test_kills.py"
