"""The rule SQL: what a user's rule computes for a message, and how a bad rule is refused."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.rules.sql import EvalError, MessageView, RuleSyntaxError, compile_rule
from services.rules.sql.operators import like_matcher


def view(payload: object = None, topic: str = "sensors/room1/temp", **kw: object) -> MessageView:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return MessageView("acme", topic, raw, **kw)  # type: ignore[arg-type]


def run(sql: str, v: MessageView) -> dict[str, object] | None:
    return compile_rule(sql).apply(v)


def one(expr: str, v: MessageView | None = None) -> object:
    out = run(f'SELECT {expr} AS x FROM "#"', v or view({}))
    assert out is not None
    return out["x"]


def test_issue_example_filters_and_projects() -> None:
    rule = compile_rule(
        'SELECT payload.temp AS t, clientid, topic FROM "sensors/#" WHERE payload.temp > 30'
    )
    assert rule.filters == ("sensors/#",)
    hot = view({"temp": 31.5}, clientid="dev1")
    assert rule.apply(hot) == {"t": 31.5, "clientid": "dev1", "topic": "sensors/room1/temp"}
    assert rule.encode(rule.apply(hot) or {}, hot) == (
        b'{"t":31.5,"clientid":"dev1","topic":"sensors/room1/temp"}'
    )
    assert rule.apply(view({"temp": 30})) is None
    assert rule.apply(view({"other": 1})) is None  # missing field: NULL, not an error
    assert rule.apply(view(b"not json")) is None


def test_payloads_orjson_refuses_still_decode_and_encode() -> None:
    """The fast JSON codec falls back to the standard library: a 70-bit integer, a NaN literal
    and UTF-16 text are JSON to a rule as before, and outputs stay compact UTF-8."""
    rule = compile_rule('SELECT payload.n AS n, payload.s AS s FROM "#"')
    big = view(rb'{"n": 1180591620717411303424, "s": "h\u00e9"}')
    cols = rule.apply(big)
    assert cols == {"n": 2**70, "s": "h\u00e9"}
    encoded = rule.encode(cols or {}, big)
    assert json.loads(encoded) == {"n": 2**70, "s": "h\u00e9"} and b'"s":"h\xc3\xa9"' in encoded
    nan = rule.apply(view(b'{"n": NaN, "s": "x"}'))
    assert nan is not None and nan["n"] != nan["n"]
    assert rule.apply(view('{"n": 1, "s": "y"}'.encode("utf-16"))) == {"n": 1, "s": "y"}


def test_several_filters_in_from() -> None:
    rule = compile_rule('SELECT topic FROM "a/+", "b/#",\n "c"')
    assert rule.filters == ("a/+", "b/#", "c")


def test_fields_reach_topic_levels_properties_and_metadata() -> None:
    v = view(
        {"a": {"b": [10, 20, {"c": "deep"}]}},
        topic="site/7/temp",
        qos=1,
        retain=True,
        clientid="c1",
        username="u1",
        published_at_ms=1700000000123,
        message_id="m-1",
        user_properties=(("unit", "C"), ("unit", "K"), ("k", "v")),
    )
    out = run(
        "SELECT topic[1] AS site, topic[2] AS id, topic[9] AS none, qos, retain, clientid, "
        "username, timestamp, message_id, tenant, user_properties['unit'] AS unit, "
        "payload.a.b[0] AS first, payload.a.b[-1].c AS c, payload['a']['b'][1] AS second "
        'FROM "#"',
        v,
    )
    assert out == {
        "site": "site",
        "id": "7",
        "none": None,
        "qos": 1,
        "retain": True,
        "clientid": "c1",
        "username": "u1",
        "timestamp": 1700000000123,
        "message_id": "m-1",
        "tenant": "acme",
        "unit": "K",  # a repeated property keeps its last value
        "first": 10,
        "c": "deep",
        "second": 20,
    }


def test_select_star_and_raw_payload() -> None:
    v = view({"t": 1}, clientid="c")
    star = compile_rule('SELECT * FROM "#"')
    out = star.apply(v)
    assert out is not None and out["payload"] == {"t": 1} and out["clientid"] == "c"
    raw = compile_rule('SELECT payload FROM "#"')
    assert raw.raw_payload
    binary = view(b"\x00\xffraw")
    assert raw.encode(raw.apply(binary) or {}, binary) == b"\x00\xffraw"
    aliased = compile_rule('SELECT payload AS p FROM "#"')
    assert not aliased.raw_payload


@pytest.mark.parametrize(
    ("where", "passes"),
    [
        ("payload.n = 5", True),
        ("payload.n <> 5", False),
        ("payload.n >= 5 AND payload.n <= 5", True),
        ("payload.n BETWEEN 1 AND 4", False),
        ("payload.n IN (1, 5, 9)", True),
        ("payload.s IN ('x', 'y')", False),
        ("payload.missing IS NULL", True),
        ("payload.s IS NOT NULL", True),
        ("payload.flag IS TRUE", True),
        ("NOT payload.flag", False),
        ("payload.missing > 1 OR payload.n = 5", True),  # NULL OR TRUE
        ("payload.missing > 1 AND payload.n = 5", False),  # NULL AND TRUE: not true
        ("NOT (payload.missing > 1)", False),  # NOT NULL is NULL
        ("payload.s = 5", False),  # different types: never equal
        ("payload.s > 5", False),  # different types: unknown
        ("payload.s LIKE 'he%o'", True),
        ("payload.s LIKE 'h_llo'", True),
        ("payload.s LIKE 'h%x'", False),
        ("payload.s ILIKE 'HELLO'", True),
        ("clientid LIKE 'dev\\_%'", True),
        ("payload.n % 2 = 1 AND payload.n / 2 = 2.5 AND payload.n DIV 2 = 2", True),
        ("CASE WHEN payload.n > 3 THEN 'big' ELSE 'small' END = 'big'", True),
        ("CASE payload.s WHEN 'hello' THEN 1 END = 1", True),
        ("CAST(payload.ns AS INT) = 12 AND CAST(payload.n AS TEXT) = '5'", True),
        ("payload.n + 1 = 6 AND -payload.n = -5 AND payload.n * 2 - 1 = 9", True),
        ("payload.s || '!' = 'hello!'", True),
    ],
)
def test_where_semantics(where: str, passes: bool) -> None:
    v = view({"n": 5, "s": "hello", "flag": True, "ns": " 12 "}, clientid="dev_1")
    rule = compile_rule(f'SELECT clientid FROM "#" WHERE {where}')
    assert (rule.apply(v) is not None) is passes


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("lower('AbC')", "abc"),
        ("upper('AbC')", "ABC"),
        ("length('héllo')", 5),
        ("trim('  a ')", "a"),
        ("ltrim('  a ')", "a "),
        ("rtrim('  a ')", "  a"),
        ("concat('a', 1, NULL, 'b')", "a1b"),
        ("substr('abcdef', 2, 3)", "bcd"),
        ("substring('abcdef', -2)", "ef"),
        ("replace('a-b-c', '-', '+')", "a+b+c"),
        ("split('a/b/c', '/')", ["a", "b", "c"]),
        ("starts_with('abc', 'ab')", True),
        ("ends_with('abc', 'bc')", True),
        ("contains('abc', 'x')", False),
        ("lpad('7', 3, '0')", "007"),
        ("rpad('7', 3)", "7  "),
        ("reverse('abc')", "cba"),
        ("abs(-3)", 3),
        ("round(2.567, 2)", 2.57),
        ("round(2.5)", 2),
        ("floor(2.7)", 2),
        ("ceil(2.1)", 3),
        ("sqrt(16)", 4.0),
        ("power(2, 10)", 1024.0),
        ("mod(7, 3)", 1),
        ("ln(1)", 0.0),
        ("log10(1000)", 3.0),
        ("log2(8)", 3.0),
        ("exp(0)", 1.0),
        ("least(3, NULL, 1)", 1),
        ("greatest(3, 1)", 3),
        ("sign(-2)", -1),
        ("json_encode(payload.o)", '{"k":[1,2]}'),
        ("json_decode('{\"a\":1}')", {"a": 1}),
        ("json_get('{\"a\":{\"b\":[5,6]}}', 'a.b.1')", 6),
        ("json_get(payload.o, 'k.0')", 1),
        ("format_time(0)", "1970-01-01T00:00:00.000Z"),
        ("format_time(86400000, '%Y-%m-%d')", "1970-01-02"),
        ("iso_to_ms('1970-01-01T00:00:01+00:00')", 1000),
        ("md5('a')", hashlib.md5(b"a").hexdigest()),
        ("sha1('a')", hashlib.sha1(b"a").hexdigest()),
        ("sha256('a')", hashlib.sha256(b"a").hexdigest()),
        ("crc32('a')", 3904355907),
        ("base64_encode('hi')", "aGk="),
        ("base64_decode('aGk=')", "hi"),
        ("hex('hi')", "6869"),
        ("to_number('1.5')", 1.5),
        ("to_string(payload.o)", '{"k":[1,2]}'),
        ("to_bool('yes')", True),
        ("coalesce(payload.missing, 'd')", "d"),
        ("ifnull(NULL, 2)", 2),
        ("nullif(1, 1)", None),
        ("IF(payload.o IS NULL, 'a', 'b')", "b"),
        ("upper(NULL)", None),  # NULL in, NULL out
    ],
)
def test_functions(expr: str, expected: object) -> None:
    assert one(expr, view({"o": {"k": [1, 2]}})) == expected


def test_impure_functions_are_evaluated_per_message() -> None:
    rule = compile_rule('SELECT now_ms() AS t, uuid() AS u FROM "#"')
    a, b = rule.apply(view({})), rule.apply(view({}))
    assert a is not None and b is not None
    assert a["u"] != b["u"] and isinstance(a["t"], int) and a["t"] > 1_600_000_000_000


@pytest.mark.parametrize(
    ("sql", "line", "column", "words"),
    [
        ('SELECT x FROM "a"', 1, 8, "unknown field 'x'"),
        ('SELECT nope(1) FROM "a"', 1, 8, "unknown function 'nope'"),
        ('SELECT lower(1, 2) FROM "a"', 1, 18, "arguments"),
        ('SELECT sha256(1, 2) FROM "a"', 1, 8, "sha256() takes 1 arguments, got 2"),
        ('SELECT topic FROM "a/#/b"', 1, 19, "bad topic filter"),
        ("SELECT topic FROM a", 1, 19, "quoted topic filters"),
        ('SELECT topic\nFROM "a"\nWHERE payload.t >', 3, 17, "expression"),
        ('SELECT topic FROM "a" GROUP BY topic', 1, 32, "GROUP"),
        ('SELECT topic FROM "a" ORDER BY topic', 1, 32, "ORDER"),
        ('SELECT topic FROM "a" JOIN "b" ON 1 = 1', 1, 28, "no JOIN"),
        ('SELECT topic AS a, qos AS a FROM "a"', 1, 20, "two columns named 'a'"),
        ('SELECT sqrt(-1) FROM "a"', 1, 8, "math domain"),
        ('SELECT topic FROM "$events/nope"', 1, 19, "unknown event source"),
        ('SELECT topic FROM "$share/g/a"', 1, 19, "$share"),
        ('SELECT topic FROM "a", "a"', 1, 24, "listed twice"),
        ('SELECT topic[0] FROM "a"', 1, 8, "1-based"),
        ('SELECT topic FROM "a" WHERE clientid LIKE clientid', 1, 29, "constant string"),
        ('SELECT topic FROM "a"; SELECT qos FROM "b"', 1, 1, "exactly one"),
        ("", 1, 1, "empty"),
        ('DELETE FROM "a"', 1, 13, "SELECT"),
        ('SELECT FROM "a"', 1, 1, "names no column"),
    ],
)
def test_bad_rule_is_refused_with_its_position(
    sql: str, line: int, column: int, words: str
) -> None:
    with pytest.raises(RuleSyntaxError) as err:
        compile_rule(sql)
    assert words in str(err.value)
    assert (err.value.line, err.value.column) == (line, column), str(err.value)
    assert f"line {line}, column {column}" in str(err.value)


def test_type_errors_fail_the_message_not_the_rule() -> None:
    rule = compile_rule('SELECT payload.v + 1 AS x FROM "#"')
    assert rule.apply(view({"v": 1})) == {"x": 2}
    with pytest.raises(EvalError):
        rule.apply(view({"v": "text"}))
    with pytest.raises(EvalError):
        compile_rule('SELECT payload.v / 0 AS x FROM "#"').apply(view({"v": 1}))
    with pytest.raises(EvalError):
        compile_rule('SELECT lower(payload.v) AS x FROM "#"').apply(view({"v": 1}))


def _like_reference(pattern: str, text: str) -> bool:
    rx = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, re.DOTALL) is not None


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab%_", max_size=8), st.text(alphabet="abc", max_size=10))
def test_like_agrees_with_a_regex_reference(pattern: str, text: str) -> None:
    assert like_matcher(pattern, fold=False)(text) is _like_reference(pattern, text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_payload_either_evaluates_or_fails_cleanly(doc: object) -> None:
    """Whatever JSON a device sends, a rule gives a result or an EvalError, never a crash."""
    rule = compile_rule(
        "SELECT payload.a + 1 AS n, upper(payload.b) AS u, payload.c[0].d AS d, "
        "concat(payload.a, payload.b) AS c, json_encode(payload) AS j "
        "FROM \"#\" WHERE payload.a > 0 OR payload.b LIKE '%x%' OR payload IS NOT NULL"
    )
    v = view({"a": doc, "b": doc, "c": [doc]})
    try:
        out = rule.apply(v)
    except EvalError:
        return
    if out is not None:
        json.loads(rule.encode(out, v))


def test_topic_filter_wildcards_are_checked_like_mqtt() -> None:
    assert fnmatch  # imported for parity with the reference helpers above
    rule = compile_rule('SELECT topic FROM "+/x/#"')
    assert rule.filters == ("+/x/#",)
