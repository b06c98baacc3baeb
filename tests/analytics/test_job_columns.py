"""The analytics jobs against the Cassandra schema, where no Cassandra server runs: every
table and column a job reads on Cassandra exists in the stores' migrations (the CREATE TABLE
and ADD COLUMN steps, parsed), and the jobs' whole Spark plans resolve on empty tables of
exactly that schema (a column a job computes with but the table lacks fails Spark's analysis,
as `connections_max` of Cassandra's `usage` did). The same jobs on a real cluster:
test_jobs_cassandra.py."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from analytics.config import AnalyticsSettings
from analytics.jobs import queue_compaction, tenant_report
from analytics.jobs.context import JobContext
from analytics.source import StoreConf
from analytics.source_arrow import CQL_TYPES
from services.common.store import (
    cassandra,
    cassandra_bans,
    cassandra_queue_cql,
    cassandra_router,
    cassandra_rules,
    cassandra_session,
    cassandra_tokens,
    cassandra_usage,
)
from services.common.store.cassandra_schema import AddColumn, Migration

STORES: tuple[Sequence[Migration], ...] = (
    cassandra.MIGRATIONS,
    cassandra_bans.MIGRATIONS,
    cassandra_queue_cql.MIGRATIONS,
    cassandra_router.MIGRATIONS,
    cassandra_rules.MIGRATIONS,
    cassandra_session.MIGRATIONS,
    cassandra_tokens.MIGRATIONS,
    cassandra_usage.MIGRATIONS,
)
_CREATE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)\s*\((.*)\)", re.S | re.I)


def _columns(body: str) -> dict[str, str]:
    """name -> CQL type of a CREATE TABLE body (the PRIMARY KEY clause skipped)."""
    body = re.split(r",?\s*PRIMARY KEY\s*\(", body, flags=re.I)[0]
    out = {}
    for part in body.split(","):
        words = part.split()
        if len(words) >= 2:
            out[words[0]] = words[1].lower()
    return out


def cassandra_tables() -> dict[str, dict[str, str]]:
    """Every table of every Cassandra store as its migrations leave it."""
    tables: dict[str, dict[str, str]] = {}
    for migrations in STORES:
        for m in migrations:
            for step in m.steps:
                if isinstance(step, AddColumn):
                    tables[step.table][step.column] = step.cql_type
                elif found := _CREATE.search(step):
                    tables.setdefault(found.group(1), {}).update(_columns(found.group(2)))
    return tables


def test_the_ddl_parser_reads_the_tables_it_is_relied_on_for() -> None:
    tables = cassandra_tables()
    assert tables["sessions"]["qos2_fence"] == "bigint"  # an added column
    assert tables["usage_daily"]["bytes_in"] == "counter"
    assert "connections_max" not in tables["usage"]  # the counter table cannot hold a max
    assert tables["queue_log"]["acked_through"] == "bigint"  # static column


class SchemaContext(JobContext):
    """A job context whose tables are empty DataFrames of the Cassandra schema; asking for a
    table or column the schema lacks fails, naming it. Records what was read."""

    def table(self, name: str, columns: Sequence[str] = ()) -> DataFrame:
        tables = cassandra_tables()
        assert name in tables, f"the job reads {name!r}, which no Cassandra store creates"
        have = tables[name]
        missing = [c for c in columns if c not in have]
        assert not missing, f"Cassandra table {name!r} has no column(s) {missing}"
        names = list(columns) or list(have)
        schema = StructType([StructField(c, CQL_TYPES.get(have[c], StringType())) for c in names])
        READ.setdefault(name, set()).update(names)
        return self.spark.createDataFrame([], schema)


READ: dict[str, set[str]] = {}


@pytest.fixture
def ctx(spark: SparkSession, tmp_path: Path) -> SchemaContext:
    store = StoreConf(cassandra=("cassandra.invalid",), keyspace="starling")
    return SchemaContext(spark, store, AnalyticsSettings(), tmp_path)


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"since_ms": 0, "until_ms": 0, "tenant": [], **kw})


def test_tenant_report_resolves_on_the_cassandra_schema(ctx: SchemaContext) -> None:
    hourly = tenant_report.hourly(ctx, _args(tenant=["acme"], since_ms=1))
    assert set(tenant_report.FIGURES) <= set(hourly.columns)
    assert hourly.collect() == []  # the plan runs, not only resolves
    assert tenant_report.top_topics(ctx, _args()).collect() == []
    assert {"usage_daily", "usage_peaks", "usage_topics", "event_log_slices"} <= set(READ)
    assert "connections_max" in READ["usage_peaks"]


def test_queue_compaction_resolves_on_the_cassandra_schema(ctx: SchemaContext) -> None:
    found = queue_compaction.candidates(ctx, now_ms=1_000)
    assert set(found) == {"queues", "retained"}  # de-duplication ids expire by TTL there
    assert found["queues"].collect() == [] and found["retained"].collect() == []
    assert {"queue_log", "sessions", "retained"} <= set(READ)
