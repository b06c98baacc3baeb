"""What both readers of format `starling` share (analytics/source.py): the Spark and Arrow
type of each store column type, the column projection, and the filters a reader applies
itself (`Pushed`: tenant =/IN and `*_ms` ranges), as SQL for SQLite and as an Arrow mask on
any batch. Executors import this module: everything here pickles.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

BATCH_ROWS = 8192  # rows per Arrow batch: big enough to amortise, small enough for memory
TENANT_COLUMN = "tenant"
TIME_SUFFIX = "_ms"  # time columns are epoch milliseconds named *_ms


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sqlite_type(declared: str) -> DataType:
    # SQLite's type affinity rules (https://sqlite.org/datatype3.html section 3.1).
    if "INT" in declared:
        return LongType()
    if "CHAR" in declared or "CLOB" in declared or "TEXT" in declared:
        return StringType()
    if "BLOB" in declared or not declared:
        return BinaryType()
    return DoubleType()


CQL_TYPES: dict[str, DataType] = {
    "text": StringType(),
    "varchar": StringType(),
    "ascii": StringType(),
    "uuid": StringType(),
    "timeuuid": StringType(),
    "inet": StringType(),
    "bigint": LongType(),
    "int": LongType(),
    "smallint": LongType(),
    "tinyint": LongType(),
    "varint": LongType(),
    "counter": LongType(),
    "boolean": BooleanType(),
    "blob": BinaryType(),
    "double": DoubleType(),
    "float": DoubleType(),
    "timestamp": TimestampType(),
}


def arrow_type(t: DataType) -> pa.DataType:
    if isinstance(t, LongType):
        return pa.int64()
    if isinstance(t, StringType):
        return pa.string()
    if isinstance(t, BinaryType):
        return pa.binary()
    if isinstance(t, BooleanType):
        return pa.bool_()
    if isinstance(t, DoubleType):
        return pa.float64()
    if isinstance(t, TimestampType):
        return pa.timestamp("us", tz="UTC")
    raise TypeError(f"no Arrow type for {t}")


def project(fields: list[StructField], columns: list[str], table: str) -> list[StructField]:
    """Only `columns` (option `columns`, in that order), or every column when none is named.
    Python data sources get no column pruning from Spark; naming the columns keeps a scan
    from copying blobs it does not need."""
    if not columns:
        return fields
    by_name = {f.name: f for f in fields}
    missing = [c for c in columns if c not in by_name]
    if missing:
        raise ValueError(f"table {table!r} has no column(s) {', '.join(missing)}")
    return [by_name[c] for c in columns]


@dataclass(frozen=True)
class Pushed:
    """A filter the reader applies itself: column, operator (= in > >= < <=) and value(s)."""

    column: str
    op: str
    value: Any

    def sql(self) -> tuple[str, list[Any]]:
        if self.op == "in":
            marks = ",".join("?" * len(self.value))
            return f"{quote(self.column)} IN ({marks})", list(self.value)
        return f"{quote(self.column)} {self.op} ?", [self.value]

    def tenants(self) -> tuple[str, ...]:
        """The tenants a tenant filter admits (= or IN)."""
        return tuple(self.value) if self.op == "in" else (self.value,)

    def mask(self, batch: pa.RecordBatch) -> Any:
        col = batch.column(batch.schema.get_field_index(self.column))
        if self.op == "in":
            return pc.is_in(col, value_set=pa.array(list(self.value), type=col.type))
        fn = {
            "=": pc.equal,
            ">": pc.greater,
            ">=": pc.greater_equal,
            "<": pc.less,
            "<=": pc.less_equal,
        }[self.op]
        return fn(col, pa.scalar(self.value, type=col.type))


_RANGE_OPS: dict[type, str] = {
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}


def pushable(f: Filter, columns: set[str]) -> Pushed | None:
    """The filter as a `Pushed` when it is one this source handles, else None."""
    attr: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(attr) != 1 or attr[0] not in columns:
        return None
    col = attr[0]
    value: Any = getattr(f, "value", None)
    if col == TENANT_COLUMN:
        if isinstance(f, EqualTo) and isinstance(value, str):
            return Pushed(col, "=", value)
        if isinstance(f, In) and all(isinstance(v, str) for v in value):
            return Pushed(col, "in", tuple(value))
        return None
    if col.endswith(TIME_SUFFIX) and type(f) in _RANGE_OPS and isinstance(value, int):
        # bool is an int too, but no time column holds one.
        return Pushed(col, _RANGE_OPS[type(f)], int(value))
    return None


def apply(batch: pa.RecordBatch, pushed: Sequence[Pushed]) -> pa.RecordBatch:
    if not pushed or batch.num_rows == 0:
        return batch
    keep = pushed[0].mask(batch)
    for p in pushed[1:]:
        keep = pc.and_(keep, p.mask(batch))
    return batch.filter(pc.fill_null(keep, False))


def tenant_filter(pushed: Sequence[Pushed]) -> tuple[str, ...] | None:
    """The tenants every pushed tenant filter admits (None: no tenant filter)."""
    allowed: set[str] | None = None
    for p in pushed:
        if p.column == TENANT_COLUMN:
            mine = set(p.tenants())
            allowed = mine if allowed is None else allowed & mine
    return None if allowed is None else tuple(sorted(allowed))


def to_batch(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    cols = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
    )


class BaseReader(DataSourceReader):
    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.pushed: list[Pushed] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        columns = set(self.schema.names)
        for f in filters:
            p = pushable(f, columns)
            if p is None:
                yield f
            else:
                self.pushed.append(p)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in self.schema.fields])
