"""Wall-clock milliseconds since the epoch, the one way every service stamps a record, an event
or a message (`published_at_ms`, `ts_ms`, store rows); durations use time.monotonic()."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, now."""
    return int(time.time() * 1000)
