"""Errors of the rule SQL: refused at creation (with a position) or failed for one message."""

from __future__ import annotations


class RuleSyntaxError(ValueError):
    """A rule the engine refuses, with the 1-based line and column of the offending text.

    A ValueError so a servicer raising it answers INVALID_ARGUMENT with the message."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"sql: line {line}, column {column}: {message}")
        self.reason = message
        self.line = line
        self.column = column


class EvalError(Exception):
    """Evaluating a rule against one message failed (a type mismatch, a result over a bound):
    the rule counts the message as failed and goes on with the next one."""
