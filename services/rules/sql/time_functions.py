"""The rule SQL's time functions: the current time, and millisecond timestamps to and from
text (UTC unless a time names its zone; strftime patterns bounded in length)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from services.rules.sql.errors import EvalError
from services.rules.sql.values import number, string


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def format_time(ms: object, fmt: object = None) -> str:
    """UTC time of a millisecond timestamp: ISO 8601 with milliseconds by default, else a
    strftime pattern."""
    try:
        dt = datetime.fromtimestamp(number(ms, "format_time") / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise EvalError(f"format_time: {exc}") from None
    if fmt is None:
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    f = string(fmt, "format_time")
    if len(f) > 128:
        raise EvalError("format_time: pattern longer than 128 characters")
    return dt.strftime(f)


def parse_time(s: object) -> int:
    """Milliseconds since the epoch of an ISO 8601 time (UTC unless it names its zone)."""
    try:
        dt = datetime.fromisoformat(string(s, "parse_time"))
    except ValueError:
        raise EvalError("iso_to_ms: not an ISO 8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)
