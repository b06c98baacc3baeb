"""The rule SQL's function set (string, math, JSON, time, hashing, conversion).

Every function is pure Python over already-evaluated arguments and bounded in what it can
cost: no regular expressions (catastrophic backtracking), padding and repetition capped by
the string bound, powers computed in floating point (an integer power of a large exponent
would allocate without limit). NULL in gives NULL out unless the function says otherwise
(`nullable`: it sees NULL arguments itself)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.rules.sql.errors import EvalError


@dataclass(frozen=True, slots=True)
class Function:
    impl: Callable[..., Any]
    min_args: int
    max_args: int
    nullable: bool = False  # receives NULL arguments instead of returning NULL
    pure: bool = True  # same arguments, same result: folded at compile time when constant


def is_number(v: object) -> bool:
    return (type(v) is int) or (type(v) is float)


def _num(v: object, name: str) -> int | float:
    if type(v) is int or type(v) is float:
        return v  # type: ignore[return-value]
    if type(v) is bool:
        return int(v)  # type: ignore[arg-type]
    raise EvalError(f"{name}: expected a number, got {type_name(v)}")


def _str(v: object, name: str) -> str:
    if type(v) is str:
        return v  # type: ignore[return-value]
    raise EvalError(f"{name}: expected a string, got {type_name(v)}")


def _int(v: object, name: str) -> int:
    if type(v) is int:
        return v  # type: ignore[return-value]
    if type(v) is float and v.is_integer():  # type: ignore[union-attr]
        return int(v)  # type: ignore[arg-type]
    raise EvalError(f"{name}: expected an integer, got {type_name(v)}")


def _bytes(v: object, name: str) -> bytes:
    if type(v) is str:
        return v.encode()  # type: ignore[union-attr]
    if type(v) is bytes:
        return v  # type: ignore[return-value]
    raise EvalError(f"{name}: expected a string, got {type_name(v)}")


def type_name(v: object) -> str:
    if v is None:
        return "NULL"
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(v), type(v).__name__)


def to_text(v: object) -> str:
    """A value as text: strings as they are, everything else as its JSON."""
    if type(v) is str:
        return v  # type: ignore[return-value]
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


# -- strings


def _substr(s: object, start: object, length: object = None) -> str:
    text = _str(s, "substr")
    i = _int(start, "substr")
    # SQL positions are 1-based; 0 behaves as 1, negative counts from the end.
    begin = i - 1 if i > 0 else (len(text) + i if i < 0 else 0)
    begin = max(begin, 0)
    if length is None:
        return text[begin:]
    n = _int(length, "substr")
    return text[begin : begin + max(n, 0)]


def _split(s: object, sep: object) -> list[str]:
    sep_s = _str(sep, "split")
    if not sep_s:
        raise EvalError("split: empty separator")
    return _str(s, "split").split(sep_s)


def _pad(left: bool) -> Callable[..., str]:
    def pad(s: object, width: object, fill: object = " ") -> str:
        text, n, f = _str(s, "pad"), _int(width, "pad"), _str(fill, "pad")
        if not f or n <= len(text):
            return text[: max(n, 0)]
        if n > _PAD_LIMIT:
            raise EvalError(f"pad: width over {_PAD_LIMIT}")
        fill_all = (f * ((n - len(text)) // len(f) + 1))[: n - len(text)]
        return fill_all + text if left else text + fill_all

    return pad


_PAD_LIMIT = 1 << 16


def _concat(*args: object) -> str:
    # NULL arguments are skipped, as in most SQL dialects' CONCAT.
    return "".join(to_text(a) for a in args if a is not None)


def _trim(chars: str | None) -> Callable[..., str]:
    return lambda s: _str(s, "trim").strip(chars)


# -- math


def _round(x: object, digits: object = 0) -> int | float:
    v, d = _num(x, "round"), _int(digits, "round")
    if abs(d) > 32:
        raise EvalError("round: digits out of range -32..32")
    return round(v, d) if d else round(v)


def _power(x: object, y: object) -> float:
    try:
        return float(_num(x, "power")) ** float(_num(y, "power"))
    except (OverflowError, ZeroDivisionError) as exc:
        raise EvalError(f"power: {exc}") from None


def _math(fn: Callable[[float], float], name: str) -> Callable[[object], float]:
    def apply(x: object) -> float:
        try:
            return fn(_num(x, name))
        except (ValueError, OverflowError) as exc:
            raise EvalError(f"{name}: {exc}") from None

    return apply


def _floor(x: object) -> int:
    v = _num(x, "floor")
    return math.floor(v) if math.isfinite(v) else _bad("floor", v)


def _ceil(x: object) -> int:
    v = _num(x, "ceil")
    return math.ceil(v) if math.isfinite(v) else _bad("ceil", v)


def _bad(name: str, v: object) -> Any:
    raise EvalError(f"{name}: {v} is not finite")


def _mod(x: object, y: object) -> int | float:
    a, b = _num(x, "mod"), _num(y, "mod")
    if b == 0:
        raise EvalError("mod: division by zero")
    return math.fmod(a, b) if type(a) is float or type(b) is float else int(math.fmod(a, b))


def _least(*args: object) -> object:
    vals = [_num(a, "least") for a in args if a is not None]
    return min(vals) if vals else None


def _greatest(*args: object) -> object:
    vals = [_num(a, "greatest") for a in args if a is not None]
    return max(vals) if vals else None


def _sign(x: object) -> int:
    v = _num(x, "sign")
    return (v > 0) - (v < 0)


# -- JSON


def _json_encode(v: object) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _json_decode(s: object) -> object:
    try:
        return json.loads(_str(s, "json_decode"))
    except (ValueError, RecursionError):
        raise EvalError("json_decode: not JSON") from None


def _json_get(doc: object, path: object) -> object:
    """`json_get(x, 'a.b.0')`: the member at a dotted path (array positions 0-based)."""
    cur = doc
    if type(cur) is str:
        cur = _json_decode(cur)
    for part in _str(path, "json_get").split(".") if path != "" else []:
        if type(cur) is dict:
            cur = cur.get(part)  # type: ignore[union-attr]
        elif type(cur) is list and part.lstrip("-").isdigit():
            i = int(part)
            cur = cur[i] if -len(cur) <= i < len(cur) else None  # type: ignore[arg-type]
        else:
            return None
        if cur is None:
            return None
    return cur


# -- time


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _format_time(ms: object, fmt: object = None) -> str:
    """UTC time of a millisecond timestamp: ISO 8601 with milliseconds by default, else a
    strftime pattern."""
    try:
        dt = datetime.fromtimestamp(_num(ms, "format_time") / 1000, tz=UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise EvalError(f"format_time: {exc}") from None
    if fmt is None:
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    f = _str(fmt, "format_time")
    if len(f) > 128:
        raise EvalError("format_time: pattern longer than 128 characters")
    return dt.strftime(f)


def _parse_time(s: object) -> int:
    """Milliseconds since the epoch of an ISO 8601 time (UTC unless it names its zone)."""
    try:
        dt = datetime.fromisoformat(_str(s, "parse_time"))
    except ValueError:
        raise EvalError("iso_to_ms: not an ISO 8601 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


# -- hashing and encoding


def _hash(algo: str) -> Callable[[object], str]:
    return lambda v: hashlib.new(algo, _bytes(v, algo)).hexdigest()


def _crc32(v: object) -> int:
    return zlib.crc32(_bytes(v, "crc32"))


def _b64encode(v: object) -> str:
    return base64.b64encode(_bytes(v, "base64_encode")).decode()


def _b64decode(v: object) -> str:
    try:
        raw = base64.b64decode(_str(v, "base64_decode"), validate=True)
    except (binascii.Error, ValueError):
        raise EvalError("base64_decode: not base64") from None
    return raw.decode("utf-8", "replace")


def _hex(v: object) -> str:
    if type(v) is int:
        return format(v, "x")
    return _bytes(v, "hex").hex()


# -- conversion


def _to_number(v: object) -> int | float:
    if is_number(v):
        return v  # type: ignore[return-value]
    if type(v) is bool:
        return int(v)  # type: ignore[arg-type]
    s = _str(v, "to_number").strip()
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


def _to_bool(v: object) -> bool:
    if type(v) is bool:
        return v  # type: ignore[return-value]
    if is_number(v):
        return v != 0
    s = _str(v, "to_bool").strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise EvalError(f"to_bool: {s!r} is not a boolean")


def _nullif(a: object, b: object) -> object:
    return None if a == b else a


def _coalesce(*args: object) -> object:
    for a in args:
        if a is not None:
            return a
    return None


FUNCTIONS: dict[str, Function] = {
    # strings
    "lower": Function(lambda s: _str(s, "lower").lower(), 1, 1),
    "upper": Function(lambda s: _str(s, "upper").upper(), 1, 1),
    "length": Function(lambda s: len(_str(s, "length")), 1, 1),
    "trim": Function(_trim(None), 1, 1),
    "ltrim": Function(lambda s: _str(s, "ltrim").lstrip(), 1, 1),
    "rtrim": Function(lambda s: _str(s, "rtrim").rstrip(), 1, 1),
    "concat": Function(_concat, 1, 64, nullable=True),
    "substr": Function(_substr, 2, 3),
    "substring": Function(_substr, 2, 3),
    "replace": Function(
        lambda s, a, b: _str(s, "replace").replace(_str(a, "replace"), _str(b, "replace")), 3, 3
    ),
    "split": Function(_split, 2, 2),
    "starts_with": Function(
        lambda s, p: _str(s, "starts_with").startswith(_str(p, "starts_with")), 2, 2
    ),
    "ends_with": Function(lambda s, p: _str(s, "ends_with").endswith(_str(p, "ends_with")), 2, 2),
    "contains": Function(lambda s, p: _str(p, "contains") in _str(s, "contains"), 2, 2),
    "lpad": Function(_pad(True), 2, 3),
    "rpad": Function(_pad(False), 2, 3),
    "reverse": Function(lambda s: _str(s, "reverse")[::-1], 1, 1),
    # math
    "abs": Function(lambda x: abs(_num(x, "abs")), 1, 1),
    "round": Function(_round, 1, 2),
    "floor": Function(_floor, 1, 1),
    "ceil": Function(_ceil, 1, 1),
    "sqrt": Function(_math(math.sqrt, "sqrt"), 1, 1),
    "power": Function(_power, 2, 2),
    "mod": Function(_mod, 2, 2),
    "ln": Function(_math(math.log, "ln"), 1, 1),
    "log10": Function(_math(math.log10, "log10"), 1, 1),
    "log2": Function(_math(math.log2, "log2"), 1, 1),
    "exp": Function(_math(math.exp, "exp"), 1, 1),
    "least": Function(_least, 1, 64, nullable=True),
    "greatest": Function(_greatest, 1, 64, nullable=True),
    "sign": Function(_sign, 1, 1),
    "random": Function(lambda: __import__("random").random(), 0, 0, pure=False),
    # JSON
    "json_encode": Function(_json_encode, 1, 1, nullable=True),
    "json_decode": Function(_json_decode, 1, 1),
    "json_get": Function(_json_get, 2, 2),
    # time
    "now_ms": Function(_now_ms, 0, 0, pure=False),
    "format_time": Function(_format_time, 1, 2),
    "iso_to_ms": Function(_parse_time, 1, 1),
    # hashing and encoding
    "md5": Function(_hash("md5"), 1, 1),
    "sha1": Function(_hash("sha1"), 1, 1),
    "sha256": Function(_hash("sha256"), 1, 1),
    "crc32": Function(_crc32, 1, 1),
    "base64_encode": Function(_b64encode, 1, 1),
    "base64_decode": Function(_b64decode, 1, 1),
    "hex": Function(_hex, 1, 1),
    "uuid": Function(lambda: str(uuid.uuid4()), 0, 0, pure=False),
    # conversion and NULL handling
    "to_number": Function(_to_number, 1, 1),
    "to_string": Function(to_text, 1, 1),
    "to_bool": Function(_to_bool, 1, 1),
    "coalesce": Function(_coalesce, 1, 64, nullable=True),
    "ifnull": Function(_coalesce, 2, 2, nullable=True),
    "nullif": Function(_nullif, 2, 2, nullable=True),
}
