"""What a rule reaches of a message: the fields by name (`FIELDS`, what `SELECT *` outputs),
field paths as written (`payload.a.b[0]`, `topic[2]`, `user_properties['k']`) and the
closures that read them. A missing member or a payload that is not JSON reads as NULL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlglot import exp

from services.rules.sql.parse import refuse
from services.rules.sql.view import MessageView

Fn = Callable[[MessageView], Any]
Path = list[str | int]

# Message fields by name: what `SELECT *` outputs and what a bare name reaches.
FIELDS: dict[str, Fn] = {
    "topic": lambda v: v.topic,
    "payload": lambda v: v.text(),
    "clientid": lambda v: v.clientid,
    "username": lambda v: v.username,
    "qos": lambda v: v.qos,
    "retain": lambda v: v.retain,
    "timestamp": lambda v: v.published_at_ms,
    "message_id": lambda v: v.message_id,
    "tenant": lambda v: v.tenant,
    "node": lambda v: v.node,
    "user_properties": lambda v: v.props(),
    "event": lambda v: v.event,
}


def select_all(view: MessageView) -> dict[str, Any]:
    """The output of `SELECT *`: every field, the payload decoded when it is JSON."""
    out = {name: fn(view) for name, fn in FIELDS.items()}
    decoded = view.json()
    if decoded is not None:
        out["payload"] = decoded
    return out


def field_path(node: exp.Expression) -> Path | None:
    """`payload.a.b[0]` as ["payload", "a", "b", 0]; None when `node` is not a field path."""
    if isinstance(node, exp.Column):
        parts = [node.args.get(k) for k in ("catalog", "db", "table", "this")]
        out: Path = []
        for part in parts:
            if part is None:
                continue
            if not isinstance(part, exp.Identifier):
                return None
            out.append(part.this)
        return out
    if isinstance(node, exp.Dot):
        head = field_path(node.this)
        tail = node.expression
        if head is None or not isinstance(tail, exp.Identifier):
            return None
        return [*head, tail.this]
    if isinstance(node, exp.Bracket):
        head = field_path(node.this)
        if head is None or len(node.expressions) != 1:
            return None
        return _subscript(head, node.expressions[0])
    return None


def _subscript(head: Path, key: exp.Expression) -> Path | None:
    """`head[key]` for a constant string or integer key; None for any other key."""
    if isinstance(key, exp.Literal):
        if key.is_string:
            return [*head, key.this]
        try:
            return [*head, int(key.this)]
        except ValueError:
            return None
    if isinstance(key, exp.Neg) and isinstance(key.this, exp.Literal):
        try:
            return [*head, -int(key.this.this)]
        except ValueError:
            return None
    return None


def _walk(doc: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        if isinstance(step, str):
            if type(doc) is not dict:
                return None
            doc = doc.get(step)
        else:
            if type(doc) is not list or not -len(doc) <= step < len(doc):
                return None
            doc = doc[step]
    return doc


def compile_field(sql: str, node: exp.Expression, path: Path) -> Fn:
    """The closure reading `path` (from field_path(node)) of a message; RuleSyntaxError for a
    field that does not exist or a subscript the field does not take."""
    root, rest = path[0], tuple(path[1:])
    if root == "payload" and rest:
        if len(rest) == 1:
            key = rest[0]
            if type(key) is str:
                return lambda v: d.get(key) if type(d := v.json()) is dict else None
        return lambda v: _walk(v.json(), rest)
    if root == "topic" and rest:
        if len(rest) != 1 or type(rest[0]) is not int or rest[0] < 1:
            raise refuse(sql, node, "topic levels are topic[1], topic[2], ... (1-based)")
        i = rest[0] - 1
        return lambda v: s[i] if i < len(s := v.segments()) else None
    if root == "user_properties" and rest:
        if len(rest) != 1 or type(rest[0]) is not str:
            raise refuse(sql, node, "a user property is user_properties['name']")
        name = rest[0]
        return lambda v: v.props().get(name)
    if rest or not isinstance(root, str) or root not in FIELDS:
        known = ", ".join(sorted(FIELDS))
        raise refuse(sql, node, f"unknown field {node.sql()!r} (fields: {known})")
    return FIELDS[root]
