"""A frequent event (a quota refusing appends) is logged once per interval with the counts
summed per tenant, not once per occurrence."""

from __future__ import annotations

import logging

import pytest

from services.common.log_summary import LogSummary


def test_one_line_per_interval_with_the_counts_summed_per_tenant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = logging.getLogger("test.log_summary")
    summary = LogSummary(log, "queue_quota_refused", 10.0, lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.log_summary"):
        summary.add("acme", 2, "q1")  # the first: at once
        for i in range(1000):
            now[0] += 0.001
            summary.add("acme" if i % 2 else "beta", 1, f"q{i}")
        assert len(caplog.records) == 1
        now[0] = 111.0
        summary.add("acme", 3, "qz")
    lines = [(r.getMessage(), r.tenant, r.count) for r in caplog.records]  # type: ignore[attr-defined]
    assert lines[0] == ("queue_quota_refused", "acme", 2)
    assert sorted(lines[1:]) == [
        ("queue_quota_refused", "acme", 503),
        ("queue_quota_refused", "beta", 500),
    ]
    assert caplog.records[-1].example in ("qz", "q998")  # type: ignore[attr-defined]
