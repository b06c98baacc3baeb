"""JSON for the rules' hot path (a payload decoded once per message, an output encoded once
per rule and message): orjson, several times faster than the standard library, with the
standard library as the fallback wherever orjson refuses what `json` accepts (integers beyond
64 bits, `NaN` literals, UTF-16/32 text, non-string keys), so rules see the same values as
before: only faster."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """`data` as JSON; ValueError (or RecursionError) when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def dumps(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON; TypeError/ValueError when it cannot be JSON."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
