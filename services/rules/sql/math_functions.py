"""The rule SQL's math functions. Powers are computed in floating point (an integer power of a
large exponent would allocate without limit); a domain or overflow error is an EvalError."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from services.rules.sql.errors import EvalError
from services.rules.sql.values import integer, number


def round_(x: object, digits: object = 0) -> int | float:
    v, d = number(x, "round"), integer(digits, "round")
    if abs(d) > 32:
        raise EvalError("round: digits out of range -32..32")
    return round(v, d) if d else round(v)


def power(x: object, y: object) -> float:
    try:
        return float(number(x, "power")) ** float(number(y, "power"))  # type: ignore[no-any-return]
    except (OverflowError, ZeroDivisionError) as exc:
        raise EvalError(f"power: {exc}") from None


def unary(fn: Callable[[float], float], name: str) -> Callable[[object], float]:
    """A one-argument math function (`sqrt`, `ln`, ...) with its errors as EvalError."""

    def apply(x: object) -> float:
        try:
            return fn(number(x, name))
        except (ValueError, OverflowError) as exc:
            raise EvalError(f"{name}: {exc}") from None

    return apply


def floor(x: object) -> int:
    v = number(x, "floor")
    return math.floor(v) if math.isfinite(v) else _not_finite("floor", v)


def ceil(x: object) -> int:
    v = number(x, "ceil")
    return math.ceil(v) if math.isfinite(v) else _not_finite("ceil", v)


def _not_finite(name: str, v: object) -> Any:
    raise EvalError(f"{name}: {v} is not finite")


def mod(x: object, y: object) -> int | float:
    a, b = number(x, "mod"), number(y, "mod")
    if b == 0:
        raise EvalError("mod: division by zero")
    return math.fmod(a, b) if type(a) is float or type(b) is float else int(math.fmod(a, b))


def least(*args: object) -> object:
    vals = [number(a, "least") for a in args if a is not None]
    return min(vals) if vals else None


def greatest(*args: object) -> object:
    vals = [number(a, "greatest") for a in args if a is not None]
    return max(vals) if vals else None


def sign(x: object) -> int:
    v = number(x, "sign")
    return (v > 0) - (v < 0)


def random_unit() -> float:
    return random.random()
