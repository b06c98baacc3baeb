"""Starling's store tables as a Spark data source (format `starling`), for the analytics jobs.

    spark.read.format("starling").option("table", "queue_entries")
         .option("sqlite", "/var/lib/starling/data")        # the data dir or one store file
    spark.read.format("starling").option("table", "queue_entries")
         .option("cassandra", "host1,host2").option("keyspace", "starling")

Owns: resolving a table to its SQLite file, deriving each table's Spark schema from the store
itself (SQLite `PRAGMA table_info`, Cassandra schema metadata) and the format's options. The
readers: analytics/source_sqlite.py (rowid ranges, pushed filters in the SQL) and
analytics/source_cassandra.py (token ranges along the token map, each read from its own
replica at LOCAL_QUORUM, the tenant filter applied by Cassandra where CQL allows); the types
and pushed filters they share: analytics/source_arrow.py. Tenant (=, IN) and time (`*_ms`
columns: >, >=, <, <=) filters are pushed down (`pushFilters`, Spark 4.1+).

Executors run this module: everything a reader needs travels in its (picklable) fields and a
connection is opened inside `read`, never on the driver's side of the pickle.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StringType, StructField, StructType

from analytics.source_arrow import CQL_TYPES, project, sqlite_type
from analytics.source_cassandra import (
    SCAN_CONSISTENCY,
    CassandraReader,
    CassandraTarget,
    Span,
    cassandra_columns,
    token_ranges,
)
from analytics.source_sqlite import SqliteReader, connect, split_range, sqlite_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from services.common.config import ServiceSettings

__all__ = ["CassandraTarget", "Span", "split_range", "token_ranges"]

FORMAT = "starling"

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
        with connect(candidate) as db:
            if sqlite_columns(db, table):
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
        return int(spark.conf.get("spark.default.parallelism", None) or os.cpu_count() or 1)


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


# ---- the data source ----------------------------------------------------------------------


class StarlingDataSource(DataSource):
    """Format `starling`. Options: `table` (required); `sqlite` (data dir or file) or
    `cassandra` (comma-separated contact points) with `port`, `keyspace` and `consistency`
    (LOCAL_QUORUM unless named; never SERIAL, which Cassandra allows on one partition only);
    `columns`
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
        self.consistency = str(options.get("consistency") or SCAN_CONSISTENCY).upper()
        if "SERIAL" in self.consistency:  # Cassandra: one partition at a time only
            raise ValueError("option 'consistency': a scan cannot read at SERIAL")
        self.columns = [
            c.strip() for c in str(options.get("columns") or "").split(",") if c.strip()
        ]
        self.partitions = int(options.get("partitions") or default_partitions(os.cpu_count() or 1))
        if self.partitions < 1:
            raise ValueError("option 'partitions' must be at least 1")

    def schema(self) -> StructType:
        if self.cassandra:
            cols = cassandra_columns(self._cassandra_target())
            if not cols:
                raise ValueError(f"keyspace {self.keyspace} has no table {self.table!r}")
            fields = [StructField(n, CQL_TYPES.get(t, StringType())) for n, t in cols]
        else:
            path = sqlite_file(str(self.sqlite), self.table)
            with connect(path) as db:
                cols = sqlite_columns(db, self.table)
            if not cols:
                raise ValueError(f"{path} has no table {self.table!r}")
            fields = [StructField(n, sqlite_type(t)) for n, t in cols]
        return StructType(project(fields, self.columns, self.table))

    def _cassandra_target(self) -> CassandraTarget:
        return CassandraTarget(
            self.cassandra, self.port, self.keyspace, self.table, self.consistency
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.cassandra:
            return CassandraReader(self._cassandra_target(), schema, self.partitions)
        return SqliteReader(
            str(sqlite_file(str(self.sqlite), self.table)), self.table, schema, self.partitions
        )
