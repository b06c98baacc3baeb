"""Compiling a rule's expressions into closures over a message: `ExpressionCompiler.value(node)`
once per expression at creation, then one chain of calls per message, with no walk over the
syntax tree, no name lookups and no re-parsing.

Each node compiles to (closure, constant); a constant subtree (no message field, no impure
function) is evaluated once against `NO_MESSAGE`, so an error in it refuses the rule. NULL
propagates through operators and most functions; AND, OR and NOT follow SQL's three-valued
logic; non-boolean values count by truthiness."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlglot import exp

from services.rules.sql.calls import bind_call, cast_converter, resolve_call
from services.rules.sql.errors import EvalError, RuleSyntaxError
from services.rules.sql.fields import compile_field, field_path
from services.rules.sql.operators import BINARY, EQ, NEG, like_matcher
from services.rules.sql.parse import refuse
from services.rules.sql.values import to_text, type_name
from services.rules.sql.view import MessageView

Fn = Callable[[MessageView], Any]
Compiled = tuple[Fn, bool]  # (closure, whether it is constant)
NodeKind = type | tuple[type, ...]


class _NoMessage(MessageView):
    """What constant folding evaluates against: any access to a message field is a bug."""

    def __init__(self) -> None:
        super().__init__("", "", b"")


NO_MESSAGE = _NoMessage()


class ExpressionCompiler:
    """The expressions of one rule; `value(node)` for each, RuleSyntaxError (with the node's
    position in `sql`) for what a rule may not say."""

    def __init__(self, *, sql: str, max_string_bytes: int) -> None:
        self._sql = sql
        self._max_str = max_string_bytes
        # Tried in this order with isinstance (CASE, IF and CAST are functions to sqlglot).
        self._kinds: tuple[tuple[NodeKind, Callable[[Any], Compiled]], ...] = (
            (exp.Neg, self._neg),
            (exp.Not, self._not),
            ((exp.And, exp.Or), self._logic),
            (exp.DPipe, self._concat),
            (exp.Is, self._is),
            (exp.In, self._in),
            (exp.Between, self._between),
            ((exp.Like, exp.ILike), self._like),
            (exp.Case, self._case),
            (exp.If, self._if),
            (exp.Cast, self._cast),
            (exp.Func, self._function),
        )

    def _refuse(self, node: exp.Expression, message: str) -> RuleSyntaxError:
        return refuse(self._sql, node, message)

    def value(self, node: exp.Expression) -> Fn:
        """The closure computing `node`'s value for a message."""
        fn, const = self._compile(node)
        if const:
            try:
                folded = fn(NO_MESSAGE)
            except EvalError as exc:
                raise self._refuse(node, str(exc)) from None
            return lambda v: folded
        return fn

    def _compile(self, node: exp.Expression) -> Compiled:
        if isinstance(node, exp.Paren):
            return self._compile(node.this)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
            return self._constant(node)
        path = field_path(node)
        if path is not None:
            return compile_field(self._sql, node, path), False
        if type(node) in BINARY:
            return self._binary(node)
        for kind, compile_kind in self._kinds:
            if isinstance(node, kind):
                return compile_kind(node)
        if isinstance(node, exp.Star):
            raise self._refuse(node, "* only on its own: SELECT * FROM ...")
        if isinstance(node, exp.Column):
            raise self._refuse(node, f"unknown field {node.sql()!r}")
        raise self._refuse(node, f"{node.key.upper()} is not supported in a rule")

    def _constant(self, node: exp.Expression) -> Compiled:
        value: Any = None
        if isinstance(node, exp.Literal):
            value = self._literal(node)
        elif isinstance(node, exp.Boolean):
            value = bool(node.this)
        return (lambda v: value), True

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

    def _binary(self, node: exp.Expression) -> Compiled:
        op = BINARY[type(node)]
        left, lc = self._compile(node.this)
        right, rc = self._compile(node.expression)
        if rc and not lc:
            # The common `field > 30`: the constant computed once.
            r = right(NO_MESSAGE)
            return (lambda v: op(left(v), r)), False
        return (lambda v: op(left(v), right(v))), lc and rc

    def _neg(self, node: exp.Neg) -> Compiled:
        inner, const = self._compile(node.this)
        neg = NEG
        return (lambda v: neg(0, inner(v))), const

    def _not(self, node: exp.Not) -> Compiled:
        inner, const = self._compile(node.this)

        def not_(v: MessageView) -> Any:
            x = inner(v)
            return None if x is None else not x

        return not_, const

    def _logic(self, node: exp.Expression) -> Compiled:
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

    def _concat(self, node: exp.Expression) -> Compiled:
        left, lc = self._compile(node.this)
        right, rc = self._compile(node.expression)
        check = self._check_len

        def cat(v: MessageView) -> Any:
            a, b = left(v), right(v)
            if a is None or b is None:
                return None
            return check(to_text(a) + to_text(b))

        return cat, lc and rc

    def _is(self, node: exp.Is) -> Compiled:
        inner, const = self._compile(node.this)
        target = node.expression
        if isinstance(target, exp.Null):
            return (lambda v: inner(v) is None), const
        if isinstance(target, exp.Boolean):
            b = bool(target.this)
            return (lambda v: inner(v) is b), const
        raise self._refuse(node, "IS takes NULL, TRUE or FALSE")

    def _in(self, node: exp.In) -> Compiled:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise self._refuse(node, "IN takes a list of values: x IN (1, 2)")
        inner, const = self._compile(node.this)
        options = [self._compile(e) for e in node.expressions]
        if all(c for _, c in options):
            values = [fn(NO_MESSAGE) for fn, _ in options]

            def in_const(v: MessageView) -> Any:
                x = inner(v)
                if x is None:
                    return None
                return any(EQ(x, o) for o in values)

            return in_const, const
        fns = [fn for fn, _ in options]

        def in_(v: MessageView) -> Any:
            x = inner(v)
            if x is None:
                return None
            return any(EQ(x, fn(v)) for fn in fns)

        return in_, False

    def _between(self, node: exp.Between) -> Compiled:
        inner, c1 = self._compile(node.this)
        low, c2 = self._compile(node.args["low"])
        high, c3 = self._compile(node.args["high"])
        ge, le = BINARY[exp.GTE], BINARY[exp.LTE]

        def between(v: MessageView) -> Any:
            x = inner(v)
            a, b = ge(x, low(v)), le(x, high(v))
            if a is False or b is False:
                return False
            return None if a is None or b is None else True

        return between, c1 and c2 and c3

    def _like(self, node: exp.Expression) -> Compiled:
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

    def _case(self, node: exp.Case) -> Compiled:
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
                hit = EQ(s, c) if subj is not None else c
                if hit is not None and hit:
                    return val(v)
            return dflt(v) if dflt is not None else None

        return case, const

    def _if(self, node: exp.If) -> Compiled:
        if isinstance(node.parent, exp.Case):
            return self._function(node)  # a WHEN of a CASE is no IF of its own
        cond, c1 = self._compile(node.this)
        yes, c2 = self._compile(node.args["true"])
        no, c3 = self._compile(node.args["false"]) if node.args.get("false") else (None, True)

        def if_(v: MessageView) -> Any:
            c = cond(v)
            if c is not None and c:
                return yes(v)
            return no(v) if no is not None else None

        return if_, c1 and c2 and c3

    def _cast(self, node: exp.Cast) -> Compiled:
        inner, const = self._compile(node.this)
        conv = cast_converter(self._sql, node)

        def cast(v: MessageView) -> Any:
            x = inner(v)
            return None if x is None else conv(x)

        return cast, const

    def _function(self, node: exp.Func) -> Compiled:
        spec, arg_nodes = resolve_call(self._sql, node)
        compiled = [self._compile(a) for a in arg_nodes]
        const = spec.pure and all(c for _, c in compiled)
        return bind_call(spec, [fn for fn, _ in compiled], self._check_len), const
