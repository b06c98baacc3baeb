"""The meaning of a parsed statement against a table: which partition and row it names, the
write ops it makes, the rows a SELECT returns from a (merged) partition, and IF conditions.
Cassandra's own refusals are kept (a conditional DELETE of a range, a SELECT without the whole
partition key, a range on any clustering column but the first) so the stores cannot rely on
something a cluster would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cassandra import InvalidRequest

from tests.simulation.cql import Rel, Stmt
from tests.simulation.data import MARKER, Part


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    cols: dict[str, str]  # column -> type
    statics: frozenset[str]
    pk: tuple[str, ...]
    ck: tuple[str, ...]
    default_ttl: int = 0


def _eq(st: Stmt, values: tuple[Any, ...], col: str) -> Any:
    for r in st.where:
        if r.col == col and r.op == "=":
            return r.val.get(values)
    return _MISSING


_MISSING = object()


def key_of(t: Table, st: Stmt, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """The partition key the statement names (all of it, by equality)."""
    if st.kind == "insert":
        got = dict(zip(st.cols, (v.get(values) for v in st.vals), strict=True))
        pk = tuple(got.get(c, _MISSING) for c in t.pk)
    else:
        pk = tuple(_eq(st, values, c) for c in t.pk)
    if any(v is _MISSING or v is None for v in pk):
        raise InvalidRequest(f"{t.name}: the whole partition key must be given")
    return pk


def row_of(t: Table, st: Stmt, values: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The clustering key a write names by equality; None when it names none (static row or
    whole partition); InvalidRequest when only part of it."""
    if not t.ck:
        return ()
    if st.kind == "insert":
        got = dict(zip(st.cols, (v.get(values) for v in st.vals), strict=True))
        ck = tuple(got.get(c, _MISSING) for c in t.ck)
    else:
        ck = tuple(_eq(st, values, c) for c in t.ck)
    if all(v is _MISSING for v in ck):
        return None
    if any(v is _MISSING for v in ck):
        return _MISSING  # type: ignore[return-value]
    return ck


def _range(t: Table, st: Stmt, values: tuple[Any, ...]) -> tuple[Any, Any]:
    """Bounds (inclusive) on the first clustering column from <, <=, >, >= relations."""
    lo, hi = -(1 << 64), 1 << 64
    for r in st.where:
        if r.col in t.pk or r.op == "=":
            continue
        if r.col != t.ck[0]:
            raise InvalidRequest(f"range on {r.col}: only the first clustering column")
        v = r.val.get(values)
        if r.op == ">=":
            lo = max(lo, v)
        elif r.op == ">":
            lo = max(lo, v + 1)
        elif r.op == "<=":
            hi = min(hi, v)
        elif r.op == "<":
            hi = min(hi, v - 1)
        else:
            raise InvalidRequest(f"operator {r.op} in a write")
    return lo, hi


def write_ops(
    t: Table, st: Stmt, values: tuple[Any, ...], now_us: int
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...], Any]:
    """The ops of an INSERT/UPDATE/DELETE, its partition key and row (None: static row)."""
    pk = key_of(t, st, values)
    ck = row_of(t, st, values)
    ttl = st.ttl.get(values) if st.ttl is not None else t.default_ttl
    expires = now_us + ttl * 1_000_000 if ttl else 0
    if st.kind in ("insert", "update"):
        given = dict(zip(st.cols, (v.get(values) for v in st.vals), strict=True))
        cols = {c: v for c, v in given.items() if c not in t.pk and c not in t.ck}
        static = {c: v for c, v in cols.items() if c in t.statics}
        regular = {c: v for c, v in cols.items() if c not in t.statics}
        if ck is _MISSING or (regular and ck is None and t.ck):
            raise InvalidRequest(f"{t.name}: regular columns need the whole clustering key")
        ops: list[tuple[Any, ...]] = []
        if static:
            ops.append(("cells", t.name, pk, None, static, expires))
        if st.kind == "insert" and ck is not None:
            regular = {MARKER: True, **regular}
        if regular:
            ops.append(("cells", t.name, pk, ck, regular, expires))
        return ops, pk, ck
    # DELETE
    if st.cols:
        static = {c: None for c in st.cols if c in t.statics}
        regular = {c: None for c in st.cols if c not in t.statics}
        if regular and (ck is None or ck is _MISSING):
            raise InvalidRequest("deleting regular columns needs the whole clustering key")
        ops = [("cells", t.name, pk, None, static, 0)] if static else []
        if regular:
            ops.append(("cells", t.name, pk, ck, regular, 0))
        return ops, pk, ck
    if ck is not None and ck is not _MISSING:
        return [("rowdel", t.name, pk, ck)], pk, ck
    if any(r.col in t.ck for r in st.where):
        if st.conditional:
            raise InvalidRequest("DELETE with IF must name whole rows (no ranges)")
        lo, hi = _range(t, st, values)
        return [("rangedel", t.name, pk, lo, hi)], pk, None
    return [("partdel", t.name, pk)], pk, None


def _match(r: Rel, have: Any, values: tuple[Any, ...]) -> bool:
    want = r.val.get(values)
    if r.op == "IN":
        return have in want
    if r.op == "=":
        return have == want
    if r.op == "!=":
        return have != want
    if have is None or want is None:
        return False
    return {
        "<": have < want,
        "<=": have <= want,
        ">": have > want,
        ">=": have >= want,
    }[r.op]


def condition_holds(
    t: Table, st: Stmt, values: tuple[Any, ...], part: Part, ck: Any, now_us: int
) -> tuple[bool, dict[str, Any] | None]:
    """Whether the statement's IF holds on the merged `part`; the row it looked at."""
    static_target = ck is None or (
        st.conds and all(r.col in t.statics for r in st.conds) and not st.if_exists
    )
    if static_target and not (st.if_not_exists and ck is not None):
        row: dict[str, Any] | None = part.live_static(now_us) or None
    else:
        row = part.live_row(ck, now_us)
        if row is not None:
            row = {**part.live_static(now_us), **row}
    if st.if_not_exists:
        return row is None, row
    if st.if_exists:
        return row is not None, row
    have = row or {}
    return all(_match(r, have.get(r.col), values) for r in st.conds), row


def select_rows(
    t: Table, st: Stmt, values: tuple[Any, ...], part: Part, pk: tuple[Any, ...], now_us: int
) -> list[dict[str, Any]]:
    """The rows of one partition a SELECT returns (before LIMIT), as column dicts."""
    static = part.live_static(now_us)
    base = dict(zip(t.pk, pk, strict=True))
    if st.distinct:
        rows = part.live_rows(now_us)
        return [{**base, **static}] if (static or rows) else []
    ck_rels = [r for r in st.where if r.col in t.ck]
    out = []
    for ck, cells in part.live_rows(now_us):
        row = {**base, **dict(zip(t.ck, ck, strict=True)), **static, **cells}
        if all(_match(r, row.get(r.col), values) for r in ck_rels):
            out.append(row)
    if not out and not ck_rels and static and not part.live_rows(now_us):
        out.append({**base, **static})
    return out
