"""The rule SQL's conversion and NULL-handling functions (to_number, to_bool, coalesce,
nullif); CAST converts through the same to_number and to_bool."""

from __future__ import annotations

import math

from services.rules.sql.errors import EvalError
from services.rules.sql.values import is_number, string


def to_number(v: object) -> int | float:
    if is_number(v):
        return v  # type: ignore[return-value]
    if type(v) is bool:
        return int(v)
    s = string(v, "to_number").strip()
    if len(s) > 64:
        raise EvalError("to_number: longer than 64 characters")
    try:
        return int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise EvalError(f"to_number: {s!r} is not a number") from None
        if not math.isfinite(f):
            raise EvalError(f"to_number: {s!r} is not finite") from None
        return f


def to_bool(v: object) -> bool:
    if type(v) is bool:
        return v
    if is_number(v):
        return v != 0
    s = string(v, "to_bool").strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise EvalError(f"to_bool: {s!r} is not a boolean")


def nullif(a: object, b: object) -> object:
    return None if a == b else a


def coalesce(*args: object) -> object:
    for a in args:
        if a is not None:
            return a
    return None
