"""What one replica holds, and how replicas' data merge: cells resolved last-write-wins by
timestamp (a tombstone wins a tie, as in Cassandra), TTLs on the simulated clock, row, range
(first clustering column) and partition tombstones, static cells per partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MARKER = ""  # the row marker an INSERT writes (a row with only its key still exists)
_NEVER = 1 << 62  # the expiry of a cell without a TTL, for comparing expiries


@dataclass(frozen=True, slots=True)
class Cell:
    value: Any  # None: a tombstone
    ts: int
    expires_us: int = 0  # 0: never

    def live(self, now_us: int) -> bool:
        return self.value is not None and (not self.expires_us or self.expires_us > now_us)


def newer(a: Cell | None, b: Cell) -> Cell:
    """Last write wins; at equal timestamps a tombstone, then the larger value."""
    if a is None or b.ts > a.ts:
        return b
    if b.ts < a.ts:
        return a
    if a.value is None or b.value is None:
        return a if a.value is None else b
    if a.value == b.value:  # the same value: the later expiry lives on (0: none), as in Cassandra
        return a if (a.expires_us or _NEVER) >= (b.expires_us or _NEVER) else b
    return b if repr(b.value) > repr(a.value) else a


@dataclass(slots=True)
class Part:
    """One partition on one replica."""

    static: dict[str, Cell] = field(default_factory=dict)
    rows: dict[tuple[Any, ...], dict[str, Cell]] = field(default_factory=dict)
    row_tombs: dict[tuple[Any, ...], int] = field(default_factory=dict)
    range_tombs: list[tuple[Any, Any, int]] = field(default_factory=list)  # lo, hi, ts
    part_tomb: int = -1

    def merge(self, other: Part) -> None:
        for col, cell in other.static.items():
            self.static[col] = newer(self.static.get(col), cell)
        for ck, cells in other.rows.items():
            mine = self.rows.get(ck)
            if mine is None:  # cells are immutable: a new row shares them
                self.rows[ck] = dict(cells)
                continue
            for col, cell in cells.items():
                held = mine.get(col)
                if held is not cell:
                    mine[col] = newer(held, cell)
        for ck, ts in other.row_tombs.items():
            self.row_tombs[ck] = max(ts, self.row_tombs.get(ck, -1))
        for rt in other.range_tombs:
            if rt not in self.range_tombs:
                self.range_tombs.append(rt)
        self.part_tomb = max(self.part_tomb, other.part_tomb)

    def copy(self) -> Part:
        out = Part()
        out.merge(self)
        return out

    def deleted_at(self, ck: tuple[Any, ...]) -> int:
        """The newest tombstone timestamp covering row `ck`."""
        ts = max(self.part_tomb, self.row_tombs.get(ck, -1))
        for lo, hi, t in self.range_tombs:
            if t > ts and lo <= ck[0] <= hi:
                ts = t
        return ts

    def live_static(self, now_us: int) -> dict[str, Any]:
        return {
            c: cell.value
            for c, cell in self.static.items()
            if cell.live(now_us) and cell.ts > self.part_tomb
        }

    def live_row(self, ck: tuple[Any, ...], now_us: int) -> dict[str, Any] | None:
        """The row's live columns (MARKER included when its marker lives); None if dead."""
        cells = self.rows.get(ck)
        if not cells:
            return None
        dead = self.deleted_at(ck)
        out = {c: cell.value for c, cell in cells.items() if cell.live(now_us) and cell.ts > dead}
        return out or None

    def live_rows(self, now_us: int) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        out = []
        for ck in sorted(self.rows):
            row = self.live_row(ck, now_us)
            if row is not None:
                out.append((ck, row))
        return out


@dataclass(slots=True)
class Replica:
    """One node: table -> partition key -> `Part`."""

    tables: dict[str, dict[tuple[Any, ...], Part]] = field(default_factory=dict)

    def part(self, table: str, pk: tuple[Any, ...]) -> Part:
        return self.tables.setdefault(table, {}).setdefault(pk, Part())

    def apply(self, op: tuple[Any, ...], ts: int) -> None:
        """One write op at timestamp `ts` (see `Mutation`)."""
        kind, table, pk = op[0], op[1], op[2]
        p = self.part(table, pk)
        if kind == "cells":
            _, _, _, ck, cols, expires = op
            target = p.static if ck is None else p.rows.setdefault(ck, {})
            for col, value in cols.items():
                target[col] = newer(target.get(col), Cell(value, ts, expires))
        elif kind == "rowdel":
            p.row_tombs[op[3]] = max(ts, p.row_tombs.get(op[3], -1))
        elif kind == "rangedel":
            p.range_tombs.append((op[3], op[4], ts))
        elif kind == "partdel":
            p.part_tomb = max(p.part_tomb, ts)
        else:
            raise ValueError(kind)


@dataclass(frozen=True, slots=True)
class Mutation:
    """Write ops sharing one timestamp. Ops: ("cells", table, pk, ck|None, {col: value},
    expires_us), ("rowdel", table, pk, ck), ("rangedel", table, pk, lo, hi), ("partdel",
    table, pk)."""

    ops: tuple[tuple[Any, ...], ...]
    ts: int
    tag: str  # the process that wrote it

    def partitions(self) -> set[tuple[str, tuple[Any, ...]]]:
        return {(op[1], op[2]) for op in self.ops}
