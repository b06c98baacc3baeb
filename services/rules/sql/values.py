"""The rule SQL's values as functions see them: type names for errors, the text form of any
value, and the argument checks every function applies (`number`, `string`, `integer`,
`raw_bytes`), each raising EvalError that names the function."""

from __future__ import annotations

import json

from services.rules.sql.errors import EvalError


def is_number(v: object) -> bool:
    return (type(v) is int) or (type(v) is float)


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
        return v
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def number(v: object, name: str) -> int | float:
    if type(v) is int or type(v) is float:
        return v
    if type(v) is bool:
        return int(v)
    raise EvalError(f"{name}: expected a number, got {type_name(v)}")


def string(v: object, name: str) -> str:
    if type(v) is str:
        return v
    raise EvalError(f"{name}: expected a string, got {type_name(v)}")


def integer(v: object, name: str) -> int:
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    raise EvalError(f"{name}: expected an integer, got {type_name(v)}")


def raw_bytes(v: object, name: str) -> bytes:
    if type(v) is str:
        return v.encode()
    if type(v) is bytes:
        return v
    raise EvalError(f"{name}: expected a string, got {type_name(v)}")
