"""Prints the fault suite's figures as a table at the end of the run (the rows of
docs/failure-behaviour.md's figures table)."""

from __future__ import annotations

from typing import Any

from tests.faults.harness import FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    w = terminalreporter
    w.section("fault suite figures")
    w.line("| test | faults injected | sent | acked | lost | QoS 2 dup | QoS 1 dup | order |")
    w.line("|---|---|---|---|---|---|---|---|")
    for f in FIGURES:
        w.line(
            f"| {f['test']} | {f['faults']} | {f['sent']} | {f['acked']} | {f['lost']} "
            f"| {f['qos2_duplicates']} | {f['qos1_duplicates']} | {f['order_violations']} |"
        )
