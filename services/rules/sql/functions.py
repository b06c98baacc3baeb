"""The rule SQL's function set: `FUNCTIONS`, each name with its implementation, arity and
whether it sees NULL or can be folded. The implementations live by family (string_functions,
math_functions, json_functions, time_functions, encoding_functions, conversion_functions);
services/rules/sql/calls.py compiles a call against this table.

Every function is pure Python over already-evaluated arguments and bounded in what it can
cost: no regular expressions (catastrophic backtracking), padding and repetition capped by
the string bound, powers computed in floating point (an integer power of a large exponent
would allocate without limit). NULL in gives NULL out unless the function says otherwise
(`nullable`: it sees NULL arguments itself)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.rules.sql import conversion_functions as conv
from services.rules.sql import encoding_functions as enc
from services.rules.sql import json_functions as js
from services.rules.sql import math_functions as m
from services.rules.sql import string_functions as st
from services.rules.sql import time_functions as tm
from services.rules.sql.values import number, string, to_text


@dataclass(frozen=True, slots=True)
class Function:
    impl: Callable[..., Any]
    min_args: int
    max_args: int
    nullable: bool = False  # receives NULL arguments instead of returning NULL
    pure: bool = True  # same arguments, same result: folded at compile time when constant


FUNCTIONS: dict[str, Function] = {
    # strings
    "lower": Function(lambda s: string(s, "lower").lower(), 1, 1),
    "upper": Function(lambda s: string(s, "upper").upper(), 1, 1),
    "length": Function(lambda s: len(string(s, "length")), 1, 1),
    "trim": Function(st.trim(None), 1, 1),
    "ltrim": Function(lambda s: string(s, "ltrim").lstrip(), 1, 1),
    "rtrim": Function(lambda s: string(s, "rtrim").rstrip(), 1, 1),
    "concat": Function(st.concat, 1, 64, nullable=True),
    "substr": Function(st.substr, 2, 3),
    "substring": Function(st.substr, 2, 3),
    "replace": Function(
        lambda s, a, b: string(s, "replace").replace(string(a, "replace"), string(b, "replace")),
        3,
        3,
    ),
    "split": Function(st.split, 2, 2),
    "starts_with": Function(
        lambda s, p: string(s, "starts_with").startswith(string(p, "starts_with")), 2, 2
    ),
    "ends_with": Function(
        lambda s, p: string(s, "ends_with").endswith(string(p, "ends_with")), 2, 2
    ),
    "contains": Function(lambda s, p: string(p, "contains") in string(s, "contains"), 2, 2),
    "lpad": Function(st.pad(True), 2, 3),
    "rpad": Function(st.pad(False), 2, 3),
    "reverse": Function(lambda s: string(s, "reverse")[::-1], 1, 1),
    # math
    "abs": Function(lambda x: abs(number(x, "abs")), 1, 1),
    "round": Function(m.round_, 1, 2),
    "floor": Function(m.floor, 1, 1),
    "ceil": Function(m.ceil, 1, 1),
    "sqrt": Function(m.unary(math.sqrt, "sqrt"), 1, 1),
    "power": Function(m.power, 2, 2),
    "mod": Function(m.mod, 2, 2),
    "ln": Function(m.unary(math.log, "ln"), 1, 1),
    "log10": Function(m.unary(math.log10, "log10"), 1, 1),
    "log2": Function(m.unary(math.log2, "log2"), 1, 1),
    "exp": Function(m.unary(math.exp, "exp"), 1, 1),
    "least": Function(m.least, 1, 64, nullable=True),
    "greatest": Function(m.greatest, 1, 64, nullable=True),
    "sign": Function(m.sign, 1, 1),
    "random": Function(m.random_unit, 0, 0, pure=False),
    # JSON
    "json_encode": Function(js.json_encode, 1, 1, nullable=True),
    "json_decode": Function(js.json_decode, 1, 1),
    "json_get": Function(js.json_get, 2, 2),
    # time
    "now_ms": Function(tm.now_ms, 0, 0, pure=False),
    "format_time": Function(tm.format_time, 1, 2),
    "iso_to_ms": Function(tm.parse_time, 1, 1),
    # hashing and encoding
    "md5": Function(enc.digest("md5"), 1, 1),
    "sha1": Function(enc.digest("sha1"), 1, 1),
    "sha256": Function(enc.digest("sha256"), 1, 1),
    "crc32": Function(enc.crc32, 1, 1),
    "base64_encode": Function(enc.b64encode, 1, 1),
    "base64_decode": Function(enc.b64decode, 1, 1),
    "hex": Function(enc.hex_, 1, 1),
    "uuid": Function(enc.uuid4_text, 0, 0, pure=False),
    # conversion and NULL handling
    "to_number": Function(conv.to_number, 1, 1),
    "to_string": Function(to_text, 1, 1),
    "to_bool": Function(conv.to_bool, 1, 1),
    "coalesce": Function(conv.coalesce, 1, 64, nullable=True),
    "ifnull": Function(conv.coalesce, 2, 2, nullable=True),
    "nullif": Function(conv.nullif, 2, 2, nullable=True),
}
