"""The rule SQL's string functions that need more than one line (substr, split, padding,
concat, trim); the one-liners sit in the table of services/rules/sql/functions.py. Padding is
capped (`PAD_LIMIT`) so one call cannot allocate without bound."""

from __future__ import annotations

from collections.abc import Callable

from services.rules.sql.errors import EvalError
from services.rules.sql.values import integer, string, to_text

PAD_LIMIT = 1 << 16


def substr(s: object, start: object, length: object = None) -> str:
    text = string(s, "substr")
    i = integer(start, "substr")
    # SQL positions are 1-based; 0 behaves as 1, negative counts from the end.
    begin = i - 1 if i > 0 else (len(text) + i if i < 0 else 0)
    begin = max(begin, 0)
    if length is None:
        return text[begin:]
    n = integer(length, "substr")
    return text[begin : begin + max(n, 0)]


def split(s: object, sep: object) -> list[str]:
    sep_s = string(sep, "split")
    if not sep_s:
        raise EvalError("split: empty separator")
    return string(s, "split").split(sep_s)


def pad(left: bool) -> Callable[..., str]:
    """lpad (`left`) or rpad: the text filled to `width` with `fill`, cut when longer."""

    def apply(s: object, width: object, fill: object = " ") -> str:
        text, n, f = string(s, "pad"), integer(width, "pad"), string(fill, "pad")
        if not f or n <= len(text):
            return text[: max(n, 0)]
        if n > PAD_LIMIT:
            raise EvalError(f"pad: width over {PAD_LIMIT}")
        fill_all = (f * ((n - len(text)) // len(f) + 1))[: n - len(text)]
        return fill_all + text if left else text + fill_all

    return apply


def concat(*args: object) -> str:
    # NULL arguments are skipped, as in most SQL dialects' CONCAT.
    return "".join(to_text(a) for a in args if a is not None)


def trim(chars: str | None) -> Callable[..., str]:
    return lambda s: string(s, "trim").strip(chars)
