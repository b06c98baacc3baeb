"""Starling's store tables as a Spark data source (format `starling`), for the analytics jobs.

    spark.read.format("starling").option("table", "queue_entries")
         .option("sqlite", "/var/lib/starling/data")        # the data dir or one store file
    spark.read.format("starling").option("table", "queue_entries")
         .option("cassandra", "host1,host2").option("keyspace", "starling")

Owns: resolving a table to its SQLite file, deriving each table's Spark schema from the store
itself (SQLite `PRAGMA table_info`, Cassandra schema metadata), splitting a scan into input
partitions (SQLite: rowid ranges; Cassandra: Murmur3 token ranges) and reading a partition as
Arrow record batches. Tenant (=, IN) and time (`*_ms` columns: >, >=, <, <=) filters are pushed
down (`pushFilters`, Spark 4.1+): into the SQL on SQLite, into the batches on Cassandra (a
token-range scan reads every row anyway; dropping rows before Arrow reaches the JVM is what
saves the work).

Executors run this module: everything a reader needs travels in its (picklable) fields and a
connection is opened inside `read`, never on the driver's side of the pickle.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
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

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from services.common.config import ServiceSettings

FORMAT = "starling"
BATCH_ROWS = 8192  # rows per Arrow batch: big enough to amortise, small enough for memory
CASSANDRA_FETCH_SIZE = 5000  # rows per page of a token-range scan
TENANT_COLUMN = "tenant"
TIME_SUFFIX = "_ms"  # time columns are epoch milliseconds named *_ms

# Which embedded store file holds which table (services/common/store/open.py names the
# files). A table not listed is looked for in every *.db of the data dir.
TABLE_FILES: dict[str, str] = {
    "users": "auth.db",
    "acls": "auth.db",
    "sessions": "sessions.db",
    "subscriptions": "sessions.db",
    "inbound_qos2": "sessions.db",
    "queue_entries": "queues.db",
    "queue_msgids": "queues.db",
    "queue_state": "queues.db",
    "partition_owner": "queues.db",
    "retained": "router.db",
    "delayed": "router.db",
    "admin_tokens": "admin_tokens.db",
    "usage": "usage.db",
}

_MIN_TOKEN = -(2**63)
_MAX_TOKEN = 2**63 - 1


@dataclass(frozen=True)
class StoreConf:
    """Where the store is: the embedded SQLite files (`sqlite`: the data dir, or one file)
    or a Cassandra cluster (`cassandra` contact points, `port`, `keyspace`)."""

    sqlite: str | None = None
    cassandra: tuple[str, ...] = ()
    port: int = 9042
    keyspace: str = "starling"

    def options(self, table: str) -> dict[str, str]:
        """The data source options that read `table` from this store."""
        if self.cassandra:
            return {
                "table": table,
                "cassandra": ",".join(self.cassandra),
                "port": str(self.port),
                "keyspace": self.keyspace,
            }
        if not self.sqlite:
            raise ValueError("StoreConf names neither a SQLite data dir nor Cassandra hosts")
        return {"table": table, "sqlite": self.sqlite}


def store_conf_from_settings(settings: ServiceSettings | None = None) -> StoreConf:
    """The store the services use, from the same settings (`STARLING_*`, TOML): Cassandra
    when contact points are set, otherwise the SQLite files under data_dir."""
    if settings is None:
        from analytics.config import load_analytics_settings

        settings = load_analytics_settings()
    if settings.cassandra_contact_points:
        return StoreConf(
            cassandra=tuple(settings.cassandra_contact_points),
            port=settings.cassandra_port,
            keyspace=settings.cassandra_keyspace,
        )
    return StoreConf(sqlite=str(Path(settings.data_dir).resolve()))


def sqlite_file(path: str | Path, table: str) -> Path:
    """The SQLite file holding `table`: `path` itself when it is a file, else the file of
    TABLE_FILES (or the first *.db holding the table) in the data dir `path`."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise FileNotFoundError(f"sqlite store {p}: no such file or folder")
    known = TABLE_FILES.get(table)
    if known and (p / known).is_file():
        return p / known
    for candidate in sorted(p.glob("*.db")):
        with _connect(candidate) as db:
            if _sqlite_columns(db, table):
                return candidate
    raise FileNotFoundError(f"no store file under {p} holds table {table!r}")


def default_partitions(parallelism: int) -> int:
    """At least 1 + 2 x parallelism partitions: a slow one does not hold up a whole wave."""
    return 1 + 2 * max(1, parallelism)


def register(spark: SparkSession) -> None:
    """Make format `starling` available to `spark` and turn on Python filter push-down
    (off by default; a reader that implements pushFilters is refused without it)."""
    spark.dataSource.register(StarlingDataSource)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def spark_parallelism(spark: SparkSession) -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return int(spark.conf.get("spark.default.parallelism", str(os.cpu_count() or 1)))


def read(
    spark: SparkSession,
    store: StoreConf,
    table: str,
    partitions: int | None = None,
    columns: Sequence[str] = (),
) -> DataFrame:
    """`table` of `store` as a DataFrame (only `columns`, if named), split into `partitions`
    (default: 1 + 2 x the session's default parallelism)."""
    register(spark)
    n = partitions or default_partitions(spark_parallelism(spark))
    opts = {**store.options(table), "partitions": str(n)}
    if columns:
        opts["columns"] = ",".join(columns)
    return spark.read.format(FORMAT).options(**opts).load()


# ---- schema -------------------------------------------------------------------------------


def _connect(path: Path) -> sqlite3.Connection:
    """A read-only use of a live store file: WAL readers never block the services' writer."""
    db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    db.execute("PRAGMA query_only=1")
    return db


def _sqlite_columns(db: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    """(name, declared type) of each column, in table order; empty if there is no table."""
    return [(r[1], str(r[2]).upper()) for r in db.execute(f"PRAGMA table_info({_quote(table)})")]


def _sqlite_type(declared: str) -> DataType:
    # SQLite's type affinity rules (https://sqlite.org/datatype3.html section 3.1).
    if "INT" in declared:
        return LongType()
    if "CHAR" in declared or "CLOB" in declared or "TEXT" in declared:
        return StringType()
    if "BLOB" in declared or not declared:
        return BinaryType()
    return DoubleType()


_CQL_TYPES: dict[str, DataType] = {
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


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _arrow_type(t: DataType) -> pa.DataType:
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


# ---- filters ------------------------------------------------------------------------------


def _project(fields: list[StructField], columns: list[str], table: str) -> list[StructField]:
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
            return f"{_quote(self.column)} IN ({marks})", list(self.value)
        return f"{_quote(self.column)} {self.op} ?", [self.value]

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


def _pushable(f: Filter, columns: set[str]) -> Pushed | None:
    """The filter as a `Pushed` when it is one this source handles, else None."""
    attr = getattr(f, "attribute", ())
    if len(attr) != 1 or attr[0] not in columns:
        return None
    col = attr[0]
    if col == TENANT_COLUMN:
        if isinstance(f, EqualTo) and isinstance(f.value, str):
            return Pushed(col, "=", f.value)
        if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
            return Pushed(col, "in", tuple(f.value))
        return None
    if col.endswith(TIME_SUFFIX) and type(f) in _RANGE_OPS and isinstance(f.value, int):
        # bool is an int too, but no time column holds one.
        return Pushed(col, _RANGE_OPS[type(f)], int(f.value))
    return None


def _apply(batch: pa.RecordBatch, pushed: Sequence[Pushed]) -> pa.RecordBatch:
    if not pushed or batch.num_rows == 0:
        return batch
    keep = pushed[0].mask(batch)
    for p in pushed[1:]:
        keep = pc.and_(keep, p.mask(batch))
    return batch.filter(pc.fill_null(keep, False))


# ---- the data source ----------------------------------------------------------------------


class StarlingDataSource(DataSource):
    """Format `starling`. Options: `table` (required); `sqlite` (data dir or file) or
    `cassandra` (comma-separated contact points) with `port` and `keyspace`; `columns`
    (comma-separated; default all); `partitions`
    (default 1 + 2 x the CPUs of the planning machine; `read()` passes 1 + 2 x Spark's
    default parallelism)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.table = str(options.get("table") or "")
        if not self.table:
            raise ValueError("format starling needs option 'table'")
        self.sqlite = options.get("sqlite")
        self.cassandra = tuple(
            h.strip() for h in str(options.get("cassandra") or "").split(",") if h.strip()
        )
        if not self.sqlite and not self.cassandra:
            raise ValueError("format starling needs option 'sqlite' or 'cassandra'")
        self.port = int(options.get("port") or 9042)
        self.keyspace = str(options.get("keyspace") or "starling")
        self.columns = [
            c.strip() for c in str(options.get("columns") or "").split(",") if c.strip()
        ]
        self.partitions = int(options.get("partitions") or default_partitions(os.cpu_count() or 1))
        if self.partitions < 1:
            raise ValueError("option 'partitions' must be at least 1")

    def schema(self) -> StructType:
        if self.cassandra:
            cols = _cassandra_columns(self._cassandra_target())
            if not cols:
                raise ValueError(f"keyspace {self.keyspace} has no table {self.table!r}")
            fields = [StructField(n, _CQL_TYPES.get(t, StringType())) for n, t in cols]
        else:
            path = sqlite_file(str(self.sqlite), self.table)
            with _connect(path) as db:
                cols = _sqlite_columns(db, self.table)
            if not cols:
                raise ValueError(f"{path} has no table {self.table!r}")
            fields = [StructField(n, _sqlite_type(t)) for n, t in cols]
        return StructType(_project(fields, self.columns, self.table))

    def _cassandra_target(self) -> CassandraTarget:
        return CassandraTarget(self.cassandra, self.port, self.keyspace, self.table)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.cassandra:
            return CassandraReader(self._cassandra_target(), schema, self.partitions)
        return SqliteReader(
            str(sqlite_file(str(self.sqlite), self.table)), self.table, schema, self.partitions
        )


class _Base(DataSourceReader):
    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.pushed: list[Pushed] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        columns = set(self.schema.names)
        for f in filters:
            p = _pushable(f, columns)
            if p is None:
                yield f
            else:
                self.pushed.append(p)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in self.schema.fields])


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


class SqliteReader(_Base):
    def __init__(self, path: str, table: str, schema: StructType, partitions: int) -> None:
        super().__init__(schema)
        self.path, self.table, self.n = path, table, partitions

    def partitions(self) -> Sequence[InputPartition]:
        with _connect(Path(self.path)) as db:
            lo, hi = db.execute(
                f"SELECT min(rowid), max(rowid) FROM {_quote(self.table)}"
            ).fetchone()
        if lo is None:
            return [RowidRange(0, 0)]  # an empty table: one partition that reads nothing
        return [RowidRange(a, b) for a, b in split_range(int(lo), int(hi) + 1, self.n)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowidRange)
        if partition.hi <= partition.lo:
            return
        names = ",".join(_quote(n) for n in self.schema.names)
        where, args = ["rowid >= ?", "rowid < ?"], [partition.lo, partition.hi]
        for p in self.pushed:
            clause, values = p.sql()
            where.append(clause)
            args.extend(values)
        sql = f"SELECT {names} FROM {_quote(self.table)} WHERE {' AND '.join(where)}"
        schema = self.arrow_schema()
        with _connect(Path(self.path)) as db:
            cur = db.execute(sql, args)
            while rows := cur.fetchmany(BATCH_ROWS):
                cols = list(zip(*rows, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                    schema=schema,
                )


# ---- Cassandra ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CassandraTarget:
    hosts: tuple[str, ...]
    port: int
    keyspace: str
    table: str

    def session(self) -> tuple[Any, Any]:
        from cassandra.cluster import Cluster
        from cassandra.query import tuple_factory

        cluster = Cluster(list(self.hosts), port=self.port)
        session = cluster.connect()
        session.row_factory = tuple_factory
        return cluster, session


def _cassandra_columns(target: CassandraTarget) -> list[tuple[str, str]]:
    cluster, _ = target.session()
    try:
        ks = cluster.metadata.keyspaces.get(target.keyspace)
        meta = ks.tables.get(target.table) if ks else None
        if meta is None:
            return []
        return [(c.name, str(c.cql_type).lower()) for c in meta.columns.values()]
    finally:
        cluster.shutdown()


class TokenRange(InputPartition):
    """Rows whose partition key's Murmur3 token t has lo < t <= hi (lo >= on the first)."""

    def __init__(self, lo: int, hi: int, first: bool) -> None:
        super().__init__((lo, hi, first))
        self.lo, self.hi, self.first = lo, hi, first


def token_ranges(n: int) -> list[TokenRange]:
    """The Murmur3 ring in n contiguous, equal ranges covering every token once."""
    cuts = [_MIN_TOKEN + (_MAX_TOKEN - _MIN_TOKEN) * i // n for i in range(n + 1)]
    cuts[-1] = _MAX_TOKEN
    return [TokenRange(cuts[i], cuts[i + 1], i == 0) for i in range(n)]


class CassandraReader(_Base):
    def __init__(self, target: CassandraTarget, schema: StructType, partitions: int) -> None:
        super().__init__(schema)
        self.target, self.n = target, partitions

    def partitions(self) -> Sequence[InputPartition]:
        return token_ranges(self.n)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TokenRange)
        from cassandra.query import SimpleStatement

        cluster, session = self.target.session()
        try:
            meta = cluster.metadata.keyspaces[self.target.keyspace].tables[self.target.table]
            key = ",".join(_quote(c.name) for c in meta.partition_key)
            names = ",".join(_quote(n) for n in self.schema.names)
            lower = ">=" if partition.first else ">"
            stmt = SimpleStatement(
                f"SELECT {names} FROM {_quote(self.target.keyspace)}.{_quote(self.target.table)} "
                f"WHERE token({key}) {lower} %s AND token({key}) <= %s",
                fetch_size=CASSANDRA_FETCH_SIZE,
            )
            result = session.execute(stmt, (partition.lo, partition.hi))
            schema = self.arrow_schema()
            while True:  # page by page: one page in memory at a time
                rows = result.current_rows
                if rows:
                    cols = list(zip(*rows, strict=True))
                    batch = pa.RecordBatch.from_arrays(
                        [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                        schema=schema,
                    )
                    yield _apply(batch, self.pushed)
                if not result.has_more_pages:
                    break
                result.fetch_next_page()
        finally:
            cluster.shutdown()
