"""A log line per interval for an event that can come thousands of times a second (a quota
refusing appends, say): counts summed per tenant between lines, so the log says who and how
often without a line per occurrence. The exact counts live in the service's counters; this
is what an operator reads in the log.

The first occurrence is logged at once; those that follow within `interval_s` are summed and
logged with the first occurrence after the interval (no timer: a burst that stops leaves its
tail in the counters only)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class LogSummary:
    def __init__(
        self,
        logger: logging.Logger,
        event: str,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._event = event
        self._interval_s = interval_s
        self._clock = clock
        self._last = -float("inf")
        self._counts: dict[str, int] = {}  # tenant -> occurrences since the last line
        self._examples: dict[str, str] = {}  # tenant -> the latest subject (a queue id)

    def add(self, tenant: str, n: int = 1, example: str = "") -> None:
        self._counts[tenant] = self._counts.get(tenant, 0) + n
        if example:
            self._examples[tenant] = example
        now = self._clock()
        if now - self._last < self._interval_s:
            return
        self._last = now
        counts, self._counts = self._counts, {}
        examples, self._examples = self._examples, {}
        for t, count in counts.items():
            self._log.info(
                self._event,
                extra={
                    "tenant": t,
                    "count": count,
                    "example": examples.get(t, ""),
                    "interval_s": self._interval_s,
                },
            )
