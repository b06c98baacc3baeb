"""The rule SQL's operators over evaluated values: arithmetic, comparison and LIKE, each with
the language's NULL and type rules (docs/rules.md).

NULL in gives NULL out. Arithmetic takes numbers only, and an integer result beyond 64 bits
becomes a float so a chain of multiplications cannot grow without bound. A comparison
between different types is unknown (NULL) except `=` (false) and `<>` (true). LIKE runs
without regular expressions, so a pattern cannot backtrack catastrophically."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from sqlglot import exp

from services.rules.sql.errors import EvalError
from services.rules.sql.values import is_number, type_name

Binary = Callable[[Any, Any], Any]

_INT_BOUND = 1 << 63


def bounded(x: Any) -> Any:
    """`x`, or as a float when it is an integer beyond 64 bits."""
    if type(x) is int and not -_INT_BOUND <= x < _INT_BOUND:
        return float(x)
    return x


def arith(op: Callable[[Any, Any], Any], sym: str) -> Binary:
    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        if not (is_number(a) and is_number(b)):
            raise EvalError(f"{sym}: expected numbers, got {type_name(a)} and {type_name(b)}")
        try:
            return bounded(op(a, b))
        except ZeroDivisionError:
            raise EvalError(f"{sym}: division by zero") from None
        except OverflowError:
            raise EvalError(f"{sym}: overflow") from None

    return apply


def compare(op: Callable[[Any, Any], bool], sym: str) -> Binary:
    equality = sym in ("=", "<>")

    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        ta, tb = type(a), type(b)
        if ta is tb or (is_number(a) and is_number(b)):
            try:
                return op(a, b)
            except TypeError:
                raise EvalError(f"{sym}: cannot order {type_name(a)} values") from None
        return (sym == "<>") if equality else None

    return apply


# The binary operators by sqlglot node type (exact type: DPipe, Like, Is... are compiled apart).
BINARY: dict[type[exp.Expression], Binary] = {
    exp.Add: arith(operator.add, "+"),
    exp.Sub: arith(operator.sub, "-"),
    exp.Mul: arith(operator.mul, "*"),
    exp.Div: arith(operator.truediv, "/"),
    exp.IntDiv: arith(operator.floordiv, "DIV"),
    exp.Mod: arith(operator.mod, "%"),
    exp.EQ: compare(operator.eq, "="),
    exp.NEQ: compare(operator.ne, "<>"),
    exp.GT: compare(operator.gt, ">"),
    exp.GTE: compare(operator.ge, ">="),
    exp.LT: compare(operator.lt, "<"),
    exp.LTE: compare(operator.le, "<="),
}
EQ = BINARY[exp.EQ]
NEG = arith(operator.sub, "-")  # unary minus as 0 - x


def like_matcher(pattern: str, fold: bool) -> Callable[[str], bool]:
    """A LIKE pattern (`%` any run, `_` one character, `\\` escapes) as a matcher that runs in
    O(len(text) * len(pattern)) at worst: no regular expression, so no backtracking blow-up."""
    tokens: list[str | None] = []  # None: `%`; "\0any": `_`; else a literal character
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            tokens.append(pattern[i + 1].lower() if fold else pattern[i + 1])
            i += 2
            continue
        if ch == "%":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
        elif ch == "_":
            tokens.append("\0any")
        else:
            tokens.append(ch.lower() if fold else ch)
        i += 1

    def match(text: str) -> bool:
        if fold:
            text = text.lower()
        t = p = 0
        star_p = -1
        star_t = 0
        n, m = len(text), len(tokens)
        while t < n:
            if p < m and tokens[p] is not None and (tokens[p] == "\0any" or tokens[p] == text[t]):
                t += 1
                p += 1
            elif p < m and tokens[p] is None:
                star_p, star_t = p, t
                p += 1
            elif star_p >= 0:
                star_t += 1
                t, p = star_t, star_p + 1
            else:
                return False
        while p < m and tokens[p] is None:
            p += 1
        return p == m

    return match
