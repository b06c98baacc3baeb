"""The figure tables of the fault and partition suites, gathered from wherever their tests
ran: each test's new figures ride on its report (`user_properties`), which pytest-xdist
carries from the worker to the controller, and the root conftest prints the tables from the
reports at the end of the run, parallel or not."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

PREFIX = "starling_figures:"
REPORTED: dict[str, list[dict[str, Any]]] = {}


def hand_over(node: pytest.Item, kind: str, figures: list[dict[str, Any]]) -> None:
    """Put `figures` (this test's) on the test's reports, under `kind`."""
    for f in figures:
        node.user_properties.append((PREFIX + kind, json.dumps(f, default=str)))


def collect(report: pytest.TestReport) -> None:
    """Keep the figures a teardown report carries (each test's, once)."""
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if isinstance(name, str) and name.startswith(PREFIX):
            REPORTED.setdefault(name[len(PREFIX) :], []).append(json.loads(value))


def print_table(
    reporter: Any, kind: str, title: str, lines: Callable[[list[dict[str, Any]]], list[str]]
) -> None:
    """The table of `kind`'s figures, if any test recorded some."""
    figures = REPORTED.get(kind, [])
    if figures:
        reporter.section(title)
        for line in lines(figures):
            reporter.line(line)
