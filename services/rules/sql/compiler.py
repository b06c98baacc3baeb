"""Compiling a parsed rule into Python closures, once per rule: evaluating a message is a
chain of calls, with no walk over the syntax tree, no name lookups and no re-parsing.

Semantics (docs/rules.md is the user's reference): NULL (a missing field, a payload that is
not JSON) propagates through operators and most functions; a comparison between different
types is unknown (NULL) except `=` (false) and `<>` (true); WHERE keeps a message when its
condition is true (SQL's three-valued logic; non-boolean values count by truthiness).
Arithmetic takes numbers only, and an integer result beyond 64 bits becomes a float so a
chain of multiplications cannot grow without bound."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from services.rules.sql import jsoncodec
from services.rules.sql.errors import EvalError, RuleSyntaxError
from services.rules.sql.functions import FUNCTIONS, is_number, to_text, type_name
from services.rules.sql.parse import (
    EVENT_PREFIX,
    EVENT_SOURCES,
    ParsedRule,
    SqlLimits,
    parse_rule,
    refuse,
)
from services.rules.sql.view import MessageView

Fn = Callable[[MessageView], Any]

_INT_BOUND = 1 << 63

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
# Names sqlglot reads as something other than a column when written bare.
_BARE_FUNCTIONS = {exp.CurrentTimestamp: "now_ms"}


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


def select_all(view: MessageView) -> dict[str, Any]:
    out = {name: fn(view) for name, fn in FIELDS.items()}
    decoded = view.json()
    if decoded is not None:
        out["payload"] = decoded
    return out


def compile_rule(sql: str, limits: SqlLimits | None = None) -> CompiledRule:
    """Parse, validate and compile `sql`; RuleSyntaxError with the position of what is wrong."""
    limits = limits or SqlLimits()
    parsed = parse_rule(sql, limits)
    c = _Compiler(parsed, limits)
    where = c.truth(parsed.where) if parsed.where is not None else None
    columns = None
    raw = False
    if parsed.columns is not None:
        cols: list[tuple[str, Fn]] = []
        for node in parsed.columns:
            name, expr = _column_name(node)
            if isinstance(expr, exp.Star):
                raise refuse(sql, node, "* only on its own: SELECT * FROM ...")
            if any(name == n for n, _ in cols):
                raise refuse(sql, node, f"two columns named {name!r}: name one with AS")
            cols.append((name, c.value(expr)))
        columns = tuple(cols)
        only = parsed.columns[0]
        raw = len(parsed.columns) == 1 and _path(only) == ["payload"]
    topics = tuple(f for f in parsed.filters if not f.startswith(EVENT_PREFIX))
    events = tuple(
        EVENT_SOURCES[f[len(EVENT_PREFIX) :]] for f in parsed.filters if f.startswith(EVENT_PREFIX)
    )
    return CompiledRule(sql, topics, events, where, columns, raw)


def _column_name(node: exp.Expression) -> tuple[str, exp.Expression]:
    """Output name of a SELECT item: its alias, else the last name of a field path
    (`payload.temp` -> `temp`, as `SELECT t.col` names its column `col`), else its text."""
    if isinstance(node, exp.Alias):
        return node.alias, node.this
    path = _path(node)
    if path is not None and isinstance(path[-1], str):
        return path[-1], node
    return node.sql(), node


def _path(node: exp.Expression) -> list[str | int] | None:
    """`payload.a.b[0]` as ["payload", "a", "b", 0]; None when `node` is not a field path."""
    if isinstance(node, exp.Column):
        parts = [node.args.get(k) for k in ("catalog", "db", "table", "this")]
        out: list[str | int] = []
        for part in parts:
            if part is None:
                continue
            if not isinstance(part, exp.Identifier):
                return None
            out.append(part.this)
        return out
    if isinstance(node, exp.Dot):
        head = _path(node.this)
        tail = node.expression
        if head is None or not isinstance(tail, exp.Identifier):
            return None
        return [*head, tail.this]
    if isinstance(node, exp.Bracket):
        head = _path(node.this)
        if head is None or len(node.expressions) != 1:
            return None
        key = node.expressions[0]
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
    return None


def _walk(doc: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        if type(step) is str:
            if type(doc) is not dict:
                return None
            doc = doc.get(step)
        else:
            if type(doc) is not list or not -len(doc) <= step < len(doc):  # type: ignore[operator]
                return None
            doc = doc[step]
    return doc


def _truthy(x: Any) -> bool | None:
    return None if x is None else bool(x)


def _bounded(x: Any) -> Any:
    if type(x) is int and not -_INT_BOUND <= x < _INT_BOUND:
        return float(x)
    return x


def _arith(op: Callable[[Any, Any], Any], sym: str) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        if not (is_number(a) and is_number(b)):
            raise EvalError(f"{sym}: expected numbers, got {type_name(a)} and {type_name(b)}")
        try:
            return _bounded(op(a, b))
        except ZeroDivisionError:
            raise EvalError(f"{sym}: division by zero") from None
        except OverflowError:
            raise EvalError(f"{sym}: overflow") from None

    return apply


def _compare(op: Callable[[Any, Any], bool], sym: str) -> Callable[[Any, Any], Any]:
    equality = sym in ("=", "<>")

    def apply(a: Any, b: Any) -> Any:
        if a is None or b is None:
            return None
        ta, tb = type(a), type(b)
        if ta is tb or (is_number(a) and is_number(b)):
            try:
                return op(a, b)
            except TypeError:
                raise EvalError(f"{sym}: cannot order {type_name(a)} values") from None
        return (sym == "<>") if equality else None

    return apply


_BINARY: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.Add: _arith(operator.add, "+"),
    exp.Sub: _arith(operator.sub, "-"),
    exp.Mul: _arith(operator.mul, "*"),
    exp.Div: _arith(operator.truediv, "/"),
    exp.IntDiv: _arith(operator.floordiv, "DIV"),
    exp.Mod: _arith(operator.mod, "%"),
    exp.EQ: _compare(operator.eq, "="),
    exp.NEQ: _compare(operator.ne, "<>"),
    exp.GT: _compare(operator.gt, ">"),
    exp.GTE: _compare(operator.ge, ">="),
    exp.LT: _compare(operator.lt, "<"),
    exp.LTE: _compare(operator.le, "<="),
}
_EQ = _BINARY[exp.EQ]


def like_matcher(pattern: str, fold: bool) -> Callable[[str], bool]:
    """A LIKE pattern (`%` any run, `_` one character, `\\` escapes) as a matcher that runs in
    O(len(text) * len(pattern)) at worst: no regular expression, so no backtracking blow-up."""
    tokens: list[str | None] = []  # None: `%`; "\0any": `_`; else a literal character
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            tokens.append(pattern[i + 1].lower() if fold else pattern[i + 1])
            i += 2
            continue
        if ch == "%":
            if not tokens or tokens[-1] is not None:
                tokens.append(None)
        elif ch == "_":
            tokens.append("\0any")
        else:
            tokens.append(ch.lower() if fold else ch)
        i += 1

    def match(text: str) -> bool:
        if fold:
            text = text.lower()
        t = p = 0
        star_p = -1
        star_t = 0
        n, m = len(text), len(tokens)
        while t < n:
            if p < m and tokens[p] is not None and (tokens[p] == "\0any" or tokens[p] == text[t]):
                t += 1
                p += 1
            elif p < m and tokens[p] is None:
                star_p, star_t = p, t
                p += 1
            elif star_p >= 0:
                star_t += 1
                t, p = star_t, star_p + 1
            else:
                return False
        while p < m and tokens[p] is None:
            p += 1
        return p == m

    return match


class _Compiler:
    def __init__(self, parsed: ParsedRule, limits: SqlLimits) -> None:
        self._sql = parsed.sql
        self._max_str = limits.max_string_bytes

    def _refuse(self, node: exp.Expression, message: str) -> RuleSyntaxError:
        return refuse(self._sql, node, message)

    def truth(self, node: exp.Expression) -> Fn:
        return self.value(node)

    def value(self, node: exp.Expression) -> Fn:
        """The closure computing `node`'s value for a message."""
        fn, const = self._compile(node)
        if const:
            try:
                folded = fn(_NO_MESSAGE)
            except EvalError as exc:
                raise self._refuse(node, str(exc)) from None
            return lambda v: folded
        return fn

    def _compile(self, node: exp.Expression) -> tuple[Fn, bool]:
        """(closure, whether it is constant: no message field, no impure function)."""
        if isinstance(node, exp.Paren):
            return self._compile(node.this)
        if isinstance(node, exp.Literal):
            value = self._literal(node)
            return (lambda v: value), True
        if isinstance(node, exp.Boolean):
            b = bool(node.this)
            return (lambda v: b), True
        if isinstance(node, exp.Null):
            return (lambda v: None), True
        path = _path(node)
        if path is not None:
            return self._field(node, path), False
        if type(node) in _BINARY:
            return self._binary(node)
        if isinstance(node, exp.Neg):
            inner, const = self._compile(node.this)
            neg = _arith(operator.sub, "-")
            return (lambda v: neg(0, inner(v))), const
        if isinstance(node, exp.Not):
            inner, const = self._compile(node.this)

            def not_(v: MessageView) -> Any:
                x = inner(v)
                return None if x is None else not x

            return not_, const
        if isinstance(node, (exp.And, exp.Or)):
            return self._logic(node)
        if isinstance(node, exp.DPipe):
            return self._concat(node)
        if isinstance(node, exp.Is):
            return self._is(node)
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Between):
            return self._between(node)
        if isinstance(node, (exp.Like, exp.ILike)):
            return self._like(node)
        if isinstance(node, exp.Case):
            return self._case(node)
        if isinstance(node, exp.If) and not isinstance(node.parent, exp.Case):
            return self._if(node)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, exp.Func):
            return self._function(node)
        if isinstance(node, exp.Star):
            raise self._refuse(node, "* only on its own: SELECT * FROM ...")
        if isinstance(node, exp.Column):
            raise self._refuse(node, f"unknown field {node.sql()!r}")
        raise self._refuse(node, f"{node.key.upper()} is not supported in a rule")

    def _literal(self, node: exp.Literal) -> Any:
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            raise self._refuse(node, f"bad number {text!r}") from None

    def _field(self, node: exp.Expression, path: list[str | int]) -> Fn:
        root, rest = path[0], tuple(path[1:])
        if root == "payload" and rest:
            if len(rest) == 1:
                key = rest[0]
                if type(key) is str:
                    return lambda v: d.get(key) if type(d := v.json()) is dict else None
            return lambda v: _walk(v.json(), rest)
        if root == "topic" and rest:
            if len(rest) != 1 or type(rest[0]) is not int or rest[0] < 1:
                raise self._refuse(node, "topic levels are topic[1], topic[2], ... (1-based)")
            i = rest[0] - 1
            return lambda v: s[i] if i < len(s := v.segments()) else None
        if root == "user_properties" and rest:
            if len(rest) != 1 or type(rest[0]) is not str:
                raise self._refuse(node, "a user property is user_properties['name']")
            name = rest[0]
            return lambda v: v.props().get(name)
        if rest or not isinstance(root, str) or root not in FIELDS:
            known = ", ".join(sorted(FIELDS))
            raise self._refuse(node, f"unknown field {node.sql()!r} (fields: {known})")
        return FIELDS[root]

    def _binary(self, node: exp.Expression) -> tuple[Fn, bool]:
        op = _BINARY[type(node)]
        left, lc = self._compile(node.this)
        right, rc = self._compile(node.expression)
        if rc and not lc:
            # The common `field > 30`: the constant computed once.
            r = right(_NO_MESSAGE)
            return (lambda v: op(left(v), r)), False
        return (lambda v: op(left(v), right(v))), lc and rc

    def _logic(self, node: exp.Expression) -> tuple[Fn, bool]:
        left, lc = self._compile(node.this)
        right, rc = self._compile(node.expression)
        if isinstance(node, exp.And):

            def and_(v: MessageView) -> Any:
                a = left(v)
                if a is not None and not a:
                    return False
                b = right(v)
                if b is not None and not b:
                    return False
                return None if a is None or b is None else True

            return and_, lc and rc

        def or_(v: MessageView) -> Any:
            a = left(v)
            if a is not None and a:
                return True
            b = right(v)
            if b is not None and b:
                return True
            return None if a is None or b is None else False

        return or_, lc and rc

    def _check_len(self, s: str) -> str:
        if len(s) > self._max_str:
            raise EvalError(f"string longer than {self._max_str} characters")
        return s

    def _concat(self, node: exp.Expression) -> tuple[Fn, bool]:
        left, lc = self._compile(node.this)
        right, rc = self._compile(node.expression)
        check = self._check_len

        def cat(v: MessageView) -> Any:
            a, b = left(v), right(v)
            if a is None or b is None:
                return None
            return check(to_text(a) + to_text(b))

        return cat, lc and rc

    def _is(self, node: exp.Is) -> tuple[Fn, bool]:
        inner, const = self._compile(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            return (lambda v: inner(v) is None), const
        if isinstance(target, exp.Boolean):
            b = bool(target.this)
            return (lambda v: inner(v) is b), const
        raise self._refuse(node, "IS takes NULL, TRUE or FALSE")

    def _in(self, node: exp.In) -> tuple[Fn, bool]:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise self._refuse(node, "IN takes a list of values: x IN (1, 2)")
        inner, const = self._compile(node.this)
        options = [self._compile(e) for e in node.expressions]
        if all(c for _, c in options):
            values = [fn(_NO_MESSAGE) for fn, _ in options]

            def in_const(v: MessageView) -> Any:
                x = inner(v)
                if x is None:
                    return None
                return any(_EQ(x, o) for o in values)

            return in_const, const
        fns = [fn for fn, _ in options]

        def in_(v: MessageView) -> Any:
            x = inner(v)
            if x is None:
                return None
            return any(_EQ(x, fn(v)) for fn in fns)

        return in_, False

    def _between(self, node: exp.Between) -> tuple[Fn, bool]:
        inner, c1 = self._compile(node.this)
        low, c2 = self._compile(node.args["low"])
        high, c3 = self._compile(node.args["high"])
        ge, le = _BINARY[exp.GTE], _BINARY[exp.LTE]

        def between(v: MessageView) -> Any:
            x = inner(v)
            a, b = ge(x, low(v)), le(x, high(v))
            if a is False or b is False:
                return False
            return None if a is None or b is None else True

        return between, c1 and c2 and c3

    def _like(self, node: exp.Expression) -> tuple[Fn, bool]:
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self._refuse(node, "LIKE takes a constant string pattern")
        if node.args.get("escape"):
            raise self._refuse(node, "LIKE ... ESCAPE is not supported; \\ escapes")
        match = like_matcher(pattern.this, isinstance(node, exp.ILike))
        inner, const = self._compile(node.this)

        def like(v: MessageView) -> Any:
            x = inner(v)
            if x is None:
                return None
            if type(x) is not str:
                raise EvalError(f"LIKE: expected a string, got {type_name(x)}")
            return match(x)

        return like, const

    def _case(self, node: exp.Case) -> tuple[Fn, bool]:
        subject = self._compile(node.this) if node.this is not None else None
        branches = [
            (self._compile(i.this), self._compile(i.args["true"])) for i in node.args["ifs"]
        ]
        default = self._compile(node.args["default"]) if node.args.get("default") else None
        const = all(c and tc for (_, c), (_, tc) in branches) and (subject is None or subject[1])
        if default is not None:
            const = const and default[1]
        conds = [(cond, val) for (cond, _), (val, _) in branches]
        dflt = default[0] if default is not None else None
        subj = subject[0] if subject is not None else None

        def case(v: MessageView) -> Any:
            s = subj(v) if subj is not None else None
            for cond, val in conds:
                c = cond(v)
                hit = _EQ(s, c) if subj is not None else c
                if hit is not None and hit:
                    return val(v)
            return dflt(v) if dflt is not None else None

        return case, const

    def _if(self, node: exp.If) -> tuple[Fn, bool]:
        cond, c1 = self._compile(node.this)
        yes, c2 = self._compile(node.args["true"])
        no, c3 = self._compile(node.args["false"]) if node.args.get("false") else (None, True)

        def if_(v: MessageView) -> Any:
            c = cond(v)
            if c is not None and c:
                return yes(v)
            return no(v) if no is not None else None

        return if_, c1 and c2 and c3

    def _cast(self, node: exp.Cast) -> tuple[Fn, bool]:
        inner, const = self._compile(node.this)
        to = node.to.this
        T = exp.DataType.Type
        fns = FUNCTIONS
        if to in exp.DataType.INTEGER_TYPES:

            def conv(x: Any) -> Any:
                n = fns["to_number"].impl(x)
                return _bounded(int(n))
        elif to in exp.DataType.REAL_TYPES:

            def conv(x: Any) -> Any:
                return float(fns["to_number"].impl(x))
        elif to in exp.DataType.TEXT_TYPES:
            conv = to_text
        elif to == T.BOOLEAN:
            conv = fns["to_bool"].impl
        else:
            raise self._refuse(node, f"CAST to {node.to.sql()} is not supported")

        def cast(v: MessageView) -> Any:
            x = inner(v)
            return None if x is None else conv(x)

        return cast, const

    def _function(self, node: exp.Func) -> tuple[Fn, bool]:
        name = self._function_name(node)
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise self._refuse(node, f"unknown function {name!r} (see docs/rules.md)")
        if isinstance(node, exp.Log):
            arg_nodes = [node.expression] if node.expression is not None else [node.this]
        elif isinstance(node, exp.Anonymous):
            arg_nodes = list(node.expressions)
        else:
            arg_nodes = []
            for key in node.arg_types:
                value = node.args.get(key)
                if isinstance(value, exp.Expression):
                    arg_nodes.append(value)
                elif isinstance(value, list):
                    arg_nodes.extend(x for x in value if isinstance(x, exp.Expression))
        if not spec.min_args <= len(arg_nodes) <= spec.max_args:
            want = (
                str(spec.min_args)
                if spec.min_args == spec.max_args
                else f"{spec.min_args} to {spec.max_args}"
            )
            raise self._refuse(node, f"{name}() takes {want} arguments, got {len(arg_nodes)}")
        compiled = [self._compile(a) for a in arg_nodes]
        args = [fn for fn, _ in compiled]
        const = spec.pure and all(c for _, c in compiled)
        impl, nullable, check = spec.impl, spec.nullable, self._check_len

        def result(r: Any) -> Any:
            if type(r) is str:
                return check(r)
            return r

        if len(args) == 0:
            return (lambda v: result(impl())), const
        if len(args) == 1:
            a0 = args[0]

            def call1(v: MessageView) -> Any:
                x = a0(v)
                if x is None and not nullable:
                    return None
                return result(impl(x))

            return call1, const

        def call(v: MessageView) -> Any:
            xs = [a(v) for a in args]
            if not nullable and None in xs:
                return None
            return result(impl(*xs))

        return call, const

    def _function_name(self, node: exp.Func) -> str:
        if isinstance(node, exp.Anonymous):
            return str(node.name).lower()
        for cls, name in _BARE_FUNCTIONS.items():
            if isinstance(node, cls):
                return name
        meta = node.meta if node._meta else None
        if meta and "start" in meta and "end" in meta:
            # The name as written (sqlglot maps several names onto one node type: LTRIM and
            # RTRIM are TRIM with a position, LOG10 is LOG with a base).
            return self._sql[meta["start"] : meta["end"] + 1].lower()
        return node.key


class _NoMessage(MessageView):
    """What constant folding evaluates against: any access to a message field is a bug."""

    def __init__(self) -> None:
        super().__init__("", "", b"")


_NO_MESSAGE = _NoMessage()
