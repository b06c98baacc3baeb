"""Function calls and CAST in a rule: a call's name as written resolved in the function table
(services/rules/sql/functions.py), its arity checked at creation, and its compiled arguments
bound into one closure per call; CAST's target type resolved to a conversion. Every string a
function returns is held to the rule's string bound."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from services.rules.sql.functions import FUNCTIONS, Function
from services.rules.sql.operators import bounded
from services.rules.sql.parse import refuse
from services.rules.sql.values import to_text
from services.rules.sql.view import MessageView

Fn = Callable[[MessageView], Any]

# Names sqlglot reads as something other than a column when written bare.
_BARE_FUNCTIONS = {exp.CurrentTimestamp: "now_ms"}


def function_name(sql: str, node: exp.Func) -> str:
    """The function's name as the rule wrote it, lower case."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    for cls, name in _BARE_FUNCTIONS.items():
        if isinstance(node, cls):
            return name
    meta = node.meta if node._meta else None
    if meta and "start" in meta and "end" in meta:
        # The name as written (sqlglot maps several names onto one node type: LTRIM and
        # RTRIM are TRIM with a position, LOG10 is LOG with a base).
        return sql[meta["start"] : meta["end"] + 1].lower()
    return node.key


def _argument_nodes(node: exp.Func) -> list[exp.Expression]:
    if isinstance(node, exp.Log):
        return [node.expression] if node.expression is not None else [node.this]
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    args: list[exp.Expression] = []
    for key in node.arg_types:
        value = node.args.get(key)
        if isinstance(value, exp.Expression):
            args.append(value)
        elif isinstance(value, list):
            args.extend(x for x in value if isinstance(x, exp.Expression))
    return args


def resolve_call(sql: str, node: exp.Func) -> tuple[Function, list[exp.Expression]]:
    """The called function and its argument nodes; RuleSyntaxError for an unknown function
    or a wrong number of arguments."""
    name = function_name(sql, node)
    spec = FUNCTIONS.get(name)
    if spec is None:
        raise refuse(sql, node, f"unknown function {name!r} (see docs/rules.md)")
    arg_nodes = _argument_nodes(node)
    if not spec.min_args <= len(arg_nodes) <= spec.max_args:
        want = (
            str(spec.min_args)
            if spec.min_args == spec.max_args
            else f"{spec.min_args} to {spec.max_args}"
        )
        raise refuse(sql, node, f"{name}() takes {want} arguments, got {len(arg_nodes)}")
    return spec, arg_nodes


def bind_call(spec: Function, args: Sequence[Fn], check_len: Callable[[str], str]) -> Fn:
    """One closure calling `spec` on the values of `args` (NULL out for a NULL argument
    unless the function is nullable), its string results checked by `check_len`."""
    impl, nullable = spec.impl, spec.nullable

    def result(r: Any) -> Any:
        if type(r) is str:
            return check_len(r)
        return r

    if len(args) == 0:
        return lambda v: result(impl())
    if len(args) == 1:
        a0 = args[0]

        def call1(v: MessageView) -> Any:
            x = a0(v)
            if x is None and not nullable:
                return None
            return result(impl(x))

        return call1

    def call(v: MessageView) -> Any:
        xs = [a(v) for a in args]
        if not nullable and None in xs:
            return None
        return result(impl(*xs))

    return call


def cast_converter(sql: str, node: exp.Cast) -> Callable[[Any], Any]:
    """The conversion of CAST(x AS type) for a non-NULL x; RuleSyntaxError for a type a rule
    cannot cast to."""
    to = node.to.this
    if to in exp.DataType.INTEGER_TYPES:

        def to_int(x: Any) -> Any:
            return bounded(int(FUNCTIONS["to_number"].impl(x)))

        return to_int
    if to in exp.DataType.REAL_TYPES:

        def to_float(x: Any) -> Any:
            return float(FUNCTIONS["to_number"].impl(x))

        return to_float
    if to in exp.DataType.TEXT_TYPES:
        return to_text
    if to == exp.DataType.Type.BOOLEAN:
        return FUNCTIONS["to_bool"].impl
    raise refuse(sql, node, f"CAST to {node.to.sql()} is not supported")
