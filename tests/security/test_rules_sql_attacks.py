"""Hostile rules: a tenant's SQL must not exhaust the rules service's CPU, memory or stack,
neither at creation nor per message. Each case is refused at creation or bounded per message;
the time bound is generous (these would take minutes, or crash, without the bounds)."""

from __future__ import annotations

import json
import time

import pytest

from services.rules.sql import EvalError, MessageView, RuleSyntaxError, SqlLimits, compile_rule

BOUND_S = 2.0


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def refused(sql: str, limits: SqlLimits | None = None) -> RuleSyntaxError:
    with pytest.raises(RuleSyntaxError) as err:
        compile_rule(sql, limits)
    return err.value


def test_huge_rule_is_refused_before_parsing() -> None:
    sql = 'SELECT topic FROM "a" WHERE ' + " OR ".join(f"qos = {i}" for i in range(100_000))
    err = refused(sql)
    assert "longer than 16384 bytes" in str(err)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT " + "(" * 5000 + "1" + ")" * 5000 + ' FROM "a"',
        "SELECT " + "lower(" * 3000 + "'a'" + ")" * 3000 + ' FROM "a"',
        "SELECT payload" + "[0]" * 3000 + ' FROM "a"',
    ],
)
def test_deep_nesting_is_refused_without_recursion(sql: str) -> None:
    limits = SqlLimits(max_sql_bytes=1 << 20)
    assert timed(lambda: refused(sql, limits)) < BOUND_S
    assert "nested" in str(refused(sql, limits))


def test_long_flat_chains_are_refused_by_tree_depth() -> None:
    # No parentheses: `1+1+...` and `NOT NOT ...` build deep trees all the same.
    for body in ("+".join(["payload.a"] * 2000), "NOT " * 2000 + "TRUE"):
        err = refused(f'SELECT {body} AS x FROM "a"', SqlLimits(max_sql_bytes=1 << 20))
        assert "nested" in str(err)


def test_string_growth_is_bounded_per_message() -> None:
    # 30 pads of 60,000 characters: 1.8 million characters without the string bound.
    rule = compile_rule(
        "SELECT " + " || ".join(["lpad(payload.s, 60000, 'x')"] * 30) + ' AS x FROM "a"'
    )
    v = MessageView("t", "a", json.dumps({"s": "y" * 1000}).encode())

    def attempt() -> None:
        with pytest.raises(EvalError, match="longer than"):
            rule.apply(v)

    assert timed(attempt) < BOUND_S
    with pytest.raises(EvalError, match="width over"):
        compile_rule('SELECT lpad(payload.s, 100000000) AS x FROM "a"').apply(v)
    assert "width over" in str(refused("SELECT lpad('a', 100000000) AS x FROM \"a\""))


def test_power_and_integer_growth_are_bounded() -> None:
    err = refused('SELECT power(10, 1000000) AS x FROM "a"')  # folded at creation: overflow
    assert "power" in str(err)
    rule = compile_rule("SELECT " + " * ".join(["payload.n"] * 30) + ' AS x FROM "a"')
    v = MessageView("t", "a", json.dumps({"n": 10**300}).encode())

    def attempt() -> None:
        try:
            out = rule.apply(v)
        except EvalError:
            return
        assert out is not None and isinstance(out["x"], float)

    assert timed(attempt) < BOUND_S


def test_like_with_many_wildcards_is_linear_not_exponential() -> None:
    pattern = "%a" * 200 + "%b"
    rule = compile_rule(f"SELECT topic FROM \"a\" WHERE payload.s LIKE '{pattern}'")
    v = MessageView("t", "a", json.dumps({"s": "a" * 5000}).encode())
    assert timed(lambda: rule.apply(v)) < BOUND_S


def test_deeply_nested_payload_is_null_not_a_crash() -> None:
    rule = compile_rule('SELECT payload.a AS a FROM "a"')
    v = MessageView("t", "a", b"[" * 100_000 + b"]" * 100_000)
    assert rule.apply(v) == {"a": None}


def test_too_many_filters_and_columns_are_refused() -> None:
    filters = ", ".join(f'"t/{i}"' for i in range(17))
    assert "topic filters" in str(refused(f"SELECT topic FROM {filters}"))
    cols = ", ".join(f"qos AS c{i}" for i in range(65))
    assert "columns" in str(refused(f'SELECT {cols} FROM "a"'))
