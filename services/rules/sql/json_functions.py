"""The rule SQL's JSON functions: encode, decode, and a member at a dotted path."""

from __future__ import annotations

import json

from services.rules.sql.errors import EvalError
from services.rules.sql.values import string


def json_encode(v: object) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def json_decode(s: object) -> object:
    try:
        return json.loads(string(s, "json_decode"))
    except (ValueError, RecursionError):
        raise EvalError("json_decode: not JSON") from None


def json_get(doc: object, path: object) -> object:
    """`json_get(x, 'a.b.0')`: the member at a dotted path (array positions 0-based)."""
    cur = doc
    if type(cur) is str:
        cur = json_decode(cur)
    for part in string(path, "json_get").split(".") if path != "" else []:
        if type(cur) is dict:
            cur = cur.get(part)
        elif type(cur) is list and part.lstrip("-").isdigit():
            i = int(part)
            cur = cur[i] if -len(cur) <= i < len(cur) else None
        else:
            return None
        if cur is None:
            return None
    return cur
