"""Parsing and structural validation of a rule: text bounds, sqlglot parse, the allowed
clauses, and the FROM list (MQTT topic filters or client event sources).

Bounds are checked before sqlglot sees the text: its parser recurses per nesting level, so a
rule nested thousands deep would otherwise cost a RecursionError (or worse) at creation."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from services.common.mqtt.errors import MqttError
from services.common.topics.rules import validate_topic_filter
from services.rules.sql.errors import RuleSyntaxError

EVENT_PREFIX = "$events/"
# Client events a rule can read (`FROM "$events/client_connected"`), by the name of the
# EVENTS stream subject's last token they come from (services/session/events.py,
# services/connection/events.py).
EVENT_SOURCES = {
    "client_connected": "connected",
    "client_disconnected": "disconnected",
    "session_subscribed": "subscribed",
    "session_unsubscribed": "unsubscribed",
}
# Of those, the events connection nodes emit themselves, and only for tenants with a rule
# reading them (the session service emits the others for every tenant).
NODE_EVENTS = ("subscribed", "unsubscribed")
_ALLOWED_SELECT_ARGS = {"expressions", "from_", "from", "joins", "where"}


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """Bounds on one rule (settings of the rules service, services/rules/config.py)."""

    max_sql_bytes: int = 16384
    max_depth: int = 40
    max_filters: int = 16
    max_columns: int = 64
    max_string_bytes: int = 1 << 20


@dataclass(frozen=True, slots=True)
class ParsedRule:
    sql: str
    filters: tuple[str, ...]  # topic filters and `$events/...` sources, as written
    columns: list[exp.Expression] | None  # None: SELECT *
    where: exp.Expression | None


def position(sql: str, node: exp.Expression | None) -> tuple[int, int]:
    """1-based (line, column) where `node` begins in `sql`: the earliest token any part of
    it was parsed from (sqlglot keeps offsets on identifiers, literals and functions)."""
    start = None
    if node is not None:
        for sub in node.walk():
            meta = sub.meta if sub._meta else None  # no dict built for nodes without one
            if meta and "start" in meta and (start is None or meta["start"] < start):
                start = meta["start"]
    if start is None:
        return 1, 1
    line = sql.count("\n", 0, start) + 1
    return line, start - (sql.rfind("\n", 0, start) + 1) + 1


def refuse(sql: str, node: exp.Expression | None, message: str) -> RuleSyntaxError:
    line, col = position(sql, node)
    return RuleSyntaxError(message, line, col)


def _check_nesting(sql: str, limit: int) -> None:
    """Refuse parentheses nested deeper than `limit` before parsing (see module docstring)."""
    depth = 0
    line, col = 1, 0
    quote = ""
    for ch in sql:
        col += 1
        if ch == "\n":
            line, col = line + 1, 0
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(" or ch == "[":
            depth += 1
            if depth > limit:
                raise RuleSyntaxError(f"nested deeper than {limit} levels", line, col)
        elif ch == ")" or ch == "]":
            depth -= 1


def expression_depth(node: exp.Expression) -> int:
    """Depth of the expression tree, without recursion (a long `a+a+...` is deep too)."""
    deepest = 0
    stack = [(node, 1)]
    while stack:
        cur, d = stack.pop()
        deepest = max(deepest, d)
        for child in cur.iter_expressions():
            stack.append((child, d + 1))
    return deepest


def parse_rule(sql: str, limits: SqlLimits) -> ParsedRule:
    if len(sql.encode()) > limits.max_sql_bytes:
        raise RuleSyntaxError(f"longer than {limits.max_sql_bytes} bytes", 1, 1)
    if not sql.strip():
        raise RuleSyntaxError("empty rule", 1, 1)
    _check_nesting(sql, limits.max_depth)
    try:
        statements = sqlglot.parse(sql, error_level=sqlglot.ErrorLevel.RAISE)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        desc = str(first.get("description") or exc).split("\n")[0]
        raise RuleSyntaxError(
            desc, int(first.get("line") or 1), int(first.get("col") or 1)
        ) from None
    except TokenError as exc:
        raise RuleSyntaxError(f"cannot read the rule: {exc}", 1, 1) from None
    except RecursionError:
        raise RuleSyntaxError("nested too deeply", 1, 1) from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise RuleSyntaxError("expected exactly one SELECT statement", 1, 1)
    select = statements[0]
    if not isinstance(select, exp.Select):
        raise refuse(sql, select, 'a rule is one SELECT ... FROM "topic/filter" [WHERE ...]')
    for key, value in select.args.items():
        if value in (None, [], False) or key in _ALLOWED_SELECT_ARGS:
            continue
        node = value if isinstance(value, exp.Expression) else None
        raise refuse(sql, node, f"{key.upper().rstrip('_')} is not supported in a rule")
    depth = expression_depth(select)
    if depth > limits.max_depth:
        raise RuleSyntaxError(f"expression nested deeper than {limits.max_depth} levels", 1, 1)
    filters = _filters(sql, select, limits)
    columns: list[exp.Expression] | None = list(select.expressions)
    if not columns:
        raise RuleSyntaxError("SELECT names no column: SELECT * or a list of expressions", 1, 1)
    if len(columns) == 1 and isinstance(columns[0], exp.Star):
        columns = None
    elif len(columns) > limits.max_columns:
        raise refuse(sql, columns[limits.max_columns], f"more than {limits.max_columns} columns")
    where = select.args.get("where")
    return ParsedRule(sql, filters, columns, where.this if where is not None else None)


def _filters(sql: str, select: exp.Select, limits: SqlLimits) -> tuple[str, ...]:
    src = select.args.get("from_") or select.args.get("from")
    if src is None:
        raise refuse(sql, select, 'FROM is required: FROM "topic/filter"')
    tables = [src.this]
    for join in select.args.get("joins") or []:
        if any(join.args.get(k) for k in ("on", "using", "kind", "side", "method")):
            raise refuse(sql, join, "FROM takes topic filters separated by commas, no JOIN")
        tables.append(join.this)
    out: list[str] = []
    for table in tables:
        ident = table.this if isinstance(table, exp.Table) else None
        extra = isinstance(table, exp.Table) and any(
            table.args.get(k) for k in ("db", "catalog", "alias")
        )
        if not isinstance(ident, exp.Identifier) or not ident.quoted or extra:
            raise refuse(sql, table, 'FROM takes quoted topic filters: FROM "sensors/#"')
        filt = ident.this
        if filt.startswith(EVENT_PREFIX):
            if filt[len(EVENT_PREFIX) :] not in EVENT_SOURCES:
                known = ", ".join(EVENT_PREFIX + k for k in EVENT_SOURCES)
                raise refuse(sql, ident, f"unknown event source {filt!r} (one of {known})")
        else:
            try:
                validate_topic_filter(filt)
            except MqttError as exc:
                raise refuse(sql, ident, f"bad topic filter {filt!r}: {exc}") from None
            if filt.startswith("$share/"):
                raise refuse(sql, ident, "a rule reads every message: no $share filters")
        if filt in out:
            raise refuse(sql, ident, f"topic filter {filt!r} listed twice")
        out.append(filt)
    if len(out) > limits.max_filters:
        raise RuleSyntaxError(f"more than {limits.max_filters} topic filters in FROM", 1, 1)
    return tuple(out)
