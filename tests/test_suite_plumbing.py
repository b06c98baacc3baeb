"""The suite's own plumbing: how `make test` hands files to parallel workers
(tests/scheduling.py) and how the fault and partition figures reach the end-of-run tables
from whichever worker ran the test (tests/figures.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests import figures
from tests.scheduling import SECONDS, group_by_file


class _Item:
    """What group_by_file reads of a collected item, and the marks it adds."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.marks: list[pytest.MarkDecorator] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark)


def test_files_go_out_whole_and_longest_first() -> None:
    longest = max(SECONDS, key=SECONDS.__getitem__)
    names = ["tests/a/test_x.py::t1", f"{longest}::t1", "tests/a/test_x.py::t2", f"{longest}::t2"]
    items: list[Any] = [_Item(n) for n in names]
    group_by_file(items)
    assert [i.nodeid for i in items] == [
        f"{longest}::t1",
        f"{longest}::t2",
        "tests/a/test_x.py::t1",
        "tests/a/test_x.py::t2",
    ]
    groups = {i.nodeid: i.marks[0].kwargs["name"] for i in items}
    assert groups["tests/a/test_x.py::t2"] == "tests/a/test_x.py"
    assert groups[f"{longest}::t1"] == longest


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
