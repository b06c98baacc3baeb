"""Compiling a parsed rule, once per rule: the statement's clauses (FROM's topic filters and
event sources, WHERE, the SELECT list and its column names) into a `CompiledRule` whose
`apply(view)` evaluates a message. The expressions themselves compile in
services/rules/sql/expressions.py.

Semantics (docs/rules.md is the user's reference): NULL (a missing field, a payload that is
not JSON) propagates through operators and most functions; a comparison between different
types is unknown (NULL) except `=` (false) and `<>` (true); WHERE keeps a message when its
condition is true (SQL's three-valued logic; non-boolean values count by truthiness).
Arithmetic takes numbers only, and an integer result beyond 64 bits becomes a float so a
chain of multiplications cannot grow without bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from services.rules.sql import jsoncodec
from services.rules.sql.errors import EvalError
from services.rules.sql.expressions import ExpressionCompiler
from services.rules.sql.fields import field_path, select_all
from services.rules.sql.parse import EVENT_PREFIX, EVENT_SOURCES, SqlLimits, parse_rule, refuse
from services.rules.sql.view import MessageView

Fn = Callable[[MessageView], Any]


@dataclass(frozen=True, slots=True)
class CompiledRule:
    sql: str
    filters: tuple[str, ...]  # MQTT topic filters of FROM
    events: tuple[str, ...]  # client event kinds of FROM (`connected`, `disconnected`)
    where: Fn | None
    columns: tuple[tuple[str, Fn], ...] | None  # None: SELECT *
    raw_payload: bool  # SELECT payload alone: the output is the message's payload as is

    def apply(self, view: MessageView) -> dict[str, Any] | None:
        """The output columns for `view`, or None when WHERE drops it; EvalError on failure."""
        try:
            if self.where is not None:
                ok = self.where(view)
                if ok is None or not ok:
                    return None
            if self.columns is None:
                return select_all(view)
            return {name: fn(view) for name, fn in self.columns}
        except EvalError:
            raise
        except (TypeError, ValueError, OverflowError, ZeroDivisionError, MemoryError) as exc:
            raise EvalError(f"{type(exc).__name__}: {exc}") from None

    def encode(self, columns: dict[str, Any], view: MessageView) -> bytes:
        """The output payload: the raw payload for `SELECT payload` alone, else the columns
        as compact JSON."""
        if self.raw_payload:
            return view.payload
        return jsoncodec.dumps(columns)


def compile_rule(sql: str, limits: SqlLimits | None = None) -> CompiledRule:
    """Parse, validate and compile `sql`; RuleSyntaxError with the position of what is wrong."""
    limits = limits or SqlLimits()
    parsed = parse_rule(sql, limits)
    c = ExpressionCompiler(sql=parsed.sql, max_string_bytes=limits.max_string_bytes)
    where = c.value(parsed.where) if parsed.where is not None else None
    columns = None
    raw = False
    if parsed.columns is not None:
        columns = _columns(sql, parsed.columns, c)
        only = parsed.columns[0]
        raw = len(parsed.columns) == 1 and field_path(only) == ["payload"]
    topics = tuple(f for f in parsed.filters if not f.startswith(EVENT_PREFIX))
    events = tuple(
        EVENT_SOURCES[f[len(EVENT_PREFIX) :]] for f in parsed.filters if f.startswith(EVENT_PREFIX)
    )
    return CompiledRule(sql, topics, events, where, columns, raw)


def _columns(
    sql: str, nodes: list[exp.Expression], c: ExpressionCompiler
) -> tuple[tuple[str, Fn], ...]:
    """The SELECT list as (output name, closure); RuleSyntaxError for a `*` among other
    columns or two columns of one name."""
    cols: list[tuple[str, Fn]] = []
    for node in nodes:
        name, expr = _column_name(node)
        if isinstance(expr, exp.Star):
            raise refuse(sql, node, "* only on its own: SELECT * FROM ...")
        if any(name == n for n, _ in cols):
            raise refuse(sql, node, f"two columns named {name!r}: name one with AS")
        cols.append((name, c.value(expr)))
    return tuple(cols)


def _column_name(node: exp.Expression) -> tuple[str, exp.Expression]:
    """Output name of a SELECT item: its alias, else the last name of a field path
    (`payload.temp` -> `temp`, as `SELECT t.col` names its column `col`), else its text."""
    if isinstance(node, exp.Alias):
        return node.alias, node.this
    path = field_path(node)
    if path is not None and isinstance(path[-1], str):
        return path[-1], node
    return node.sql(), node
