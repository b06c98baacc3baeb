"""The rule SQL: `compile_rule(sql, limits)` parses a rule with sqlglot, validates it and
compiles it once into closures (`CompiledRule`); `CompiledRule.apply(view)` evaluates it per
message. docs/rules.md is the user's reference for what this package accepts."""

from services.rules.sql.compiler import CompiledRule, compile_rule
from services.rules.sql.errors import EvalError, RuleSyntaxError
from services.rules.sql.parse import SqlLimits
from services.rules.sql.view import MessageView

__all__ = [
    "CompiledRule",
    "EvalError",
    "MessageView",
    "RuleSyntaxError",
    "SqlLimits",
    "compile_rule",
]
