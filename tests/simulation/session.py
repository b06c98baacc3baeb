"""A driver `Session` on the simulated cluster: what the real stores call (prepare,
execute_async with ResponseFuture callbacks and paging, batches), each call run by the
scheduler at a moment the seed picks, as the process that made it.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel, InvalidRequest

from tests.simulation.cluster import SERIALS, Cluster
from tests.simulation.cql import Stmt, parse
from tests.simulation.data import Mutation
from tests.simulation.scheduler import Scheduler
from tests.simulation.statements import (
    Table,
    condition_holds,
    select_rows,
    write_ops,
)

_ROW_TYPES: dict[tuple[str, ...], Any] = {}


def _row(cols: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A driver-like row (namedtuple; `[applied]` becomes `applied`)."""
    cls = _ROW_TYPES.get(cols)
    if cls is None:
        names = [c.strip("[]") for c in cols]
        cls = _ROW_TYPES[cols] = namedtuple("Row", names, rename=True)  # type: ignore[misc]
    return cls(*values)


@dataclass
class SimPrepared:
    """A prepared statement (the store sets consistency_level on some)."""

    query_string: str
    consistency_level: int | None = None


@dataclass
class SimBatch:
    """BatchStatement's interface as the stores use it."""

    parts: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)
    consistency_level: int | None = None

    def add(self, stmt: Any, values: tuple[Any, ...] = ()) -> None:
        self.parts.append((stmt, tuple(values)))


class SimFuture:
    """A ResponseFuture: callbacks fire when the scheduler runs the call; later pages are
    scheduled calls of their own."""

    def __init__(
        self, session: SimSession, rows: Callable[[], list[Any]], proc: str, label: str
    ) -> None:
        self._session = session
        self._proc = proc
        self._callbacks: tuple[Callable[..., Any], Callable[..., Any]] | None = None
        self._pending: list[Any] = []
        self.has_more_pages = False
        session.sched.submit(proc, lambda: self._first(rows), label)

    def add_callbacks(self, ok: Callable[..., Any], err: Callable[..., Any]) -> None:
        self._callbacks = (ok, err)

    def _first(self, rows: Callable[[], list[Any]]) -> None:
        assert self._callbacks is not None
        try:
            got = rows()
        except Exception as exc:
            self._callbacks[1](exc)
            return
        if self._session.sched.tracing:
            self._session.sched.trace.append(f"    -> {got[:4]}")
        self._pending = got
        self._page()

    def _page(self) -> None:
        assert self._callbacks is not None
        size = self._session.fetch_size
        page, self._pending = self._pending[:size], self._pending[size:]
        self.has_more_pages = bool(self._pending)
        self._callbacks[0](page)

    def start_fetching_next_page(self) -> None:
        self._session.sched.submit(self._proc, self._page)


class SimSession:
    """The session (module docstring). `default_consistency` is the profile's level."""

    def __init__(
        self,
        cluster: Cluster,
        sched: Scheduler,
        default_consistency: int = ConsistencyLevel.LOCAL_QUORUM,
        fetch_size: int = 3,
    ) -> None:
        self.cluster = cluster
        self.sched = sched
        self.cl = default_consistency
        self.fetch_size = fetch_size
        self.tables: dict[str, Table] = {}
        self._clock: dict[str, int] = {}

    # ---- schema ----
    def create(self, migrations: Any) -> None:
        """Apply the CREATE TABLE and AddColumn steps of a store's migrations."""
        for m in migrations:
            for step in m.steps:
                if isinstance(step, str):
                    st = parse(step)
                    s = st.schema
                    cols = {c: typ for c, (typ, _) in s["cols"].items()}
                    statics = frozenset(c for c, (_, st_) in s["cols"].items() if st_)
                    self.tables[st.table] = Table(
                        st.table, cols, statics, tuple(s["pk"]), tuple(s["ck"]), s["ttl"]
                    )
                else:
                    t = self.tables[step.table]
                    t.cols[step.column] = step.cql_type

    # ---- the driver API ----
    def prepare(self, query: str) -> SimPrepared:
        parse(query)  # refuses what it cannot model now, as a cluster refuses at prepare
        return SimPrepared(query)

    def execute_async(self, query: Any, parameters: Any = None) -> SimFuture:
        proc = self.sched.current()
        values = tuple(parameters or ())
        run = self._runner(query, values, proc)
        label = ""
        if self.sched.tracing:
            label = _label(query, values)
        return SimFuture(self, run, proc, label)

    def _timestamp(self, proc: str) -> int:
        """The process's client timestamp: its skewed clock, monotonic (as the driver's)."""
        ts = max(self.cluster.now_us + self.sched.skew(proc), self._clock.get(proc, 0) + 1)
        self._clock[proc] = ts
        return ts

    def _runner(self, query: Any, values: tuple[Any, ...], proc: str) -> Callable[[], list[Any]]:
        if isinstance(query, SimBatch):
            parts = [(parse(_text(s)), v) for s, v in query.parts]
            cl = query.consistency_level or self.cl
            return lambda: self._batch(parts, cl, proc)
        st = parse(_text(query))
        cl = getattr(query, "consistency_level", None) or self.cl
        if st.kind == "batch":
            parts = _split_values(st, values)
            return lambda: self._batch(parts, cl, proc)
        if st.kind == "select":
            return lambda: self._select(st, values, cl)
        return lambda: self._batch([(st, values)], cl, proc)

    def _select(self, st: Stmt, values: tuple[Any, ...], cl: int) -> list[Any]:
        t = self.tables[st.table]
        pk: tuple[Any, ...] | None = None
        if st.where:
            from tests.simulation.statements import key_of

            pk = key_of(t, st, values)
        elif cl in SERIALS:
            raise InvalidRequest("SERIAL reads need a partition key")
        parts = self.cluster.read(st.table, pk, cl)
        rows: list[dict[str, Any]] = []
        for key, part in parts.items():
            rows += select_rows(t, st, values, part, key, self.cluster.now_us)
        if st.limit is not None:
            rows = rows[: st.limit.get(values)]
        cols = tuple(t.cols) if st.cols == ["*"] else tuple(st.cols)
        for c in cols:
            if c not in t.cols:
                raise InvalidRequest(f"Undefined column name {c}")
        return [_row(cols, tuple(r.get(c) for c in cols)) for r in rows]

    def _batch(self, parts: list[tuple[Stmt, tuple[Any, ...]]], cl: int, proc: str) -> list[Any]:
        now = self.cluster.now_us
        conditional = any(st.conditional for st, _ in parts)
        ts = self._timestamp(proc)
        planned = []
        size = 0
        for st, v in parts:
            t = self.tables[st.table]
            ops, pk, ck = write_ops(t, st, v, now)
            planned.append((st, v, t, ops, pk, ck))
            size += sum(len(x) for x in v if isinstance(x, bytes | str))
        keys = {(t.name, pk) for _, _, t, _, pk, _ in planned}
        self.cluster.check_batch(len(keys), size, conditional)
        if not conditional:
            ops = tuple(op for p in planned for op in p[3])
            explicit = [p[0].timestamp.get(p[1]) for p in planned if p[0].timestamp is not None]
            ts = explicit[0] if explicit else ts
            self.cluster.write(Mutation(ops, ts, proc), cl, len(parts) > 1)
            return []
        (key,) = keys
        return self.cluster.cas(
            key, lambda merged, ballot: _decide(planned, merged, ballot, proc, now), cl
        )


def _decide(
    planned: list[Any], merged: Any, ballot: int, proc: str, now: int
) -> tuple[bool, list[Any], Mutation | None]:
    """Evaluate a conditional batch's IFs on the partition as Paxos read it."""
    ok = True
    seen: list[dict[str, Any]] = []
    for st, v, t, _, pk, ck in planned:
        if not st.conditional:
            continue
        holds, row = condition_holds(t, st, v, merged, ck, now)
        ok = ok and holds
        if row is not None:
            key = dict(zip(t.pk, pk, strict=True))
            if ck is not None:
                key.update(zip(t.ck, ck, strict=True))
            seen.append({**key, **row})
    if ok:
        ops = tuple(op for p in planned for op in p[3])
        return True, [_row(("[applied]",), (True,))], Mutation(ops, ballot, proc)
    if not seen:
        return False, [_row(("[applied]",), (False,))], None
    out = []
    for r in seen:
        cols = ("[applied]", *(c for c in r if c))
        out.append(_row(cols, (False, *(r[c] for c in cols[1:]))))
    return False, out, None


def _label(query: Any, values: tuple[Any, ...]) -> str:
    """A call as the trace shows it."""
    if isinstance(query, SimBatch):
        inner = "; ".join(_label(s, v) for s, v in query.parts)
        return f"BATCH[{inner}]"
    head = " ".join(_text(query).split())[:70]
    shown = tuple(v[:12] if isinstance(v, bytes) else v for v in values)
    return f"{head} {shown}"


def _text(stmt: Any) -> str:
    return stmt if isinstance(stmt, str) else str(stmt.query_string)


def _split_values(st: Stmt, values: tuple[Any, ...]) -> list[tuple[Stmt, tuple[Any, ...]]]:
    """A batch written as one text: its statements all number their markers from the
    batch's first, so each gets the whole value tuple."""
    return [(part, values) for part in st.parts]
