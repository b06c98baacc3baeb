"""The embedded store's side of format `starling` (analytics/source.py): a table's columns
from `PRAGMA table_info`, a scan split into rowid ranges, each read as Arrow batches with the
pushed filters in its SQL. Read-only use of the live store files: WAL readers never block the
services' writer.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from analytics.source_arrow import BATCH_ROWS, BaseReader, quote, to_batch


def connect(path: Path) -> sqlite3.Connection:
    """A read-only use of a live store file."""
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    db.execute("PRAGMA query_only=1")
    return db


def sqlite_columns(db: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    """(name, declared type) of each column, in table order; empty if there is no table."""
    return [(r[1], str(r[2]).upper()) for r in db.execute(f"PRAGMA table_info({quote(table)})")]


class RowidRange(InputPartition):
    """Rows with lo <= rowid < hi."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


def split_range(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) in at most n contiguous, non-empty, nearly equal pieces."""
    size = hi - lo
    if size <= 0:
        return []
    n = max(1, min(n, size))
    return [(lo + size * i // n, lo + size * (i + 1) // n) for i in range(n)]


class SqliteReader(BaseReader):
    def __init__(self, path: str, table: str, schema: StructType, partitions: int) -> None:
        super().__init__(schema)
        self.path, self.table, self.n = path, table, partitions

    def partitions(self) -> Sequence[InputPartition]:
        with connect(Path(self.path)) as db:
            lo, hi = db.execute(
                f"SELECT min(rowid), max(rowid) FROM {quote(self.table)}"
            ).fetchone()
        if lo is None:
            return [RowidRange(0, 0)]  # an empty table: one partition that reads nothing
        return [RowidRange(a, b) for a, b in split_range(int(lo), int(hi) + 1, self.n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowidRange)
        if partition.hi <= partition.lo:
            return
        names = ",".join(quote(n) for n in self.schema.names)
        where, args = ["rowid >= ?", "rowid < ?"], [partition.lo, partition.hi]
        for p in self.pushed:
            clause, values = p.sql()
            where.append(clause)
            args.extend(values)
        sql = f"SELECT {names} FROM {quote(self.table)} WHERE {' AND '.join(where)}"
        schema = self.arrow_schema()
        with connect(Path(self.path)) as db:
            cur = db.execute(sql, args)
            while rows := cur.fetchmany(BATCH_ROWS):
                yield to_batch(rows, schema)
