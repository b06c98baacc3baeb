"""Tenant report against the shared mesh: clients do a known amount of work in a fresh
tenant; the report's totals for that tenant equal what they did and the metrics service's
counters for the same window; headless Chromium renders the report's charts. The report
is `starling analytics tenant-report` run once, in this process on the shared session."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from analytics.jobs import tenant_report
from services.connection.top_topics import SAMPLE_EVERY
from services.metrics.client import MetricsAdminClient
from tests.analytics.command import run_command
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until

MESSAGES = 25


def _usage(data: Path, tenant: str) -> tuple[int, int] | None:
    with sqlite3.connect(data / "usage.db") as db:
        row = db.execute(
            "SELECT sum(messages_in), sum(messages_out) FROM usage WHERE tenant=?", (tenant,)
        ).fetchone()
    return row if row and row[0] is not None else None


def _connection_ms(data: Path, tenant: str) -> int:
    with sqlite3.connect(data / "usage.db") as db:
        row = db.execute("SELECT sum(connection_ms) FROM usage WHERE tenant=?", (tenant,))
        return int(row.fetchone()[0] or 0)


def _sessions_logged(data: Path, tenant: str) -> int:
    with sqlite3.connect(data / "sessions.db") as db:
        row = db.execute(
            "SELECT count(DISTINCT client_id) FROM event_log WHERE tenant=? AND kind='connected'",
            (tenant,),
        )
        return int(row.fetchone()[0] or 0)


def _topics_recorded(data: Path, tenant: str) -> dict[str, int]:
    with sqlite3.connect(data / "usage.db") as db:
        rows = db.execute(
            "SELECT topic, sum(messages) FROM usage_topics WHERE tenant=? GROUP BY topic",
            (tenant,),
        ).fetchall()
    return {t: int(n) for t, n in rows}


def _cluster(mesh: MeshInfo, tenant: str) -> Any:
    async def get() -> Any:
        client = MetricsAdminClient(mesh.addr("metrics"), ADMIN_TOKEN)
        try:
            totals = await client.cluster_stats()
        finally:
            await client.close()
        return next((t for t in totals.tenants if t.tenant == tenant), None)

    return asyncio.run(get())


@pytest.fixture(scope="module")
def report(
    mesh: MeshInfo, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], Any, dict[str, int]]:
    tenant = f"rep{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    since = int(time.time() * 1000) // 3_600_000 * 3_600_000
    sub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    sub.connect()
    sub.subscribe("r/#", 1)
    pub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub.connect()
    for i in range(MESSAGES):
        assert pub.publish(f"r/{i % 3}", b"x" * 10, 1) is not None
    assert len(sub.expect(MESSAGES)) == MESSAGES
    data = Path(mesh.mesh.data_dir) / "data"
    # Both stay connected until the nodes' reports have seen them open for a while.
    wait_until(
        lambda: getattr(_cluster(mesh, tenant), "connections", 0) == 2,
        30,
        "2 connections",
        every_s=0.2,
    )
    wait_until(lambda: _connection_ms(data, tenant) > 0, 30, "connection time", every_s=0.2)
    sub.close()
    pub.close()
    # The nodes report every 0.5 s here; wait until the usage table has everything.
    wait_until(lambda: _usage(data, tenant) == (MESSAGES, MESSAGES), 30, "usage rows", every_s=0.2)
    wait_until(
        lambda: _sessions_logged(data, tenant) == 2,
        30,
        "connected events in the event log",
        every_s=0.2,
    )
    counters = _cluster(mesh, tenant)
    return (
        tenant,
        _run_report(spark, mesh, since, tmp_path_factory),
        counters,
        _topics_recorded(data, tenant),
    )


def _run_report(
    spark: SparkSession, mesh: MeshInfo, since: int, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """`starling analytics tenant-report --data-dir MESH --since-ms SINCE`, in this process on
    the shared session; the summary it printed (and kept as last-run.json)."""
    out = tmp_path_factory.mktemp("report")
    argv = ["tenant-report", "--data-dir", str(mesh.mesh.data_dir), "--output", str(out)]
    printed = run_command(
        spark, [*argv, "--since-ms", str(since)], {"STARLING_ANALYTICS_PARTITIONS": "3"}
    )
    summary: dict[str, Any] = json.loads(printed)
    assert json.loads((out / "tenant-report" / "last-run.json").read_text()) == summary
    return summary


def test_report_totals_equal_the_work_and_the_metrics_service(
    report: tuple[str, dict[str, Any], Any, dict[str, int]], spark: SparkSession
) -> None:
    tenant, summary, counters, recorded_topics = report
    mine = summary["totals"][tenant]
    assert mine["messages_in"] == MESSAGES and mine["messages_out"] == MESSAGES
    assert mine["dropped"] == 0 and mine["connections_peak"] == 2
    assert mine["connection_minutes"] > 0
    assert counters is not None
    assert (mine["messages_in"], mine["messages_out"], mine["dropped"]) == (
        counters.messages_in,
        counters.messages_out,
        counters.messages_dropped,
    )
    # By QoS, bytes, refusals: what the clients did, and the metrics service's counters.
    assert (mine["msgs_in_q0"], mine["msgs_in_q1"], mine["msgs_in_q2"]) == (0, MESSAGES, 0)
    assert (mine["msgs_out_q0"], mine["msgs_out_q1"], mine["msgs_out_q2"]) == (0, MESSAGES, 0)
    for k in ("msgs_in_q1", "msgs_out_q1", "bytes_in", "bytes_out", "quota_refusals"):
        assert mine[k] == getattr(counters, k), k
    assert mine["bytes_in"] >= MESSAGES * 10 and mine["bytes_out"] >= MESSAGES * 10
    assert mine["quota_refusals"] == 0
    assert mine["sessions"] == 2  # the subscriber's and the publisher's client ids
    # Top topics: the nodes' sampled summaries (one publish in 8, weighted), as the
    # metrics service recorded them; only the tenant's topics, about all its messages.
    top = dict(mine["top_topics"])
    assert top == recorded_topics
    assert set(top) <= {"r/0", "r/1", "r/2"} and top
    assert abs(sum(top.values()) - MESSAGES) <= SAMPLE_EVERY
    # The Parquet output holds the same figures.
    df = spark.read.parquet(summary["parquet"]).where(f"tenant = '{tenant}'")
    row = df.groupBy().sum("messages_in", "messages_out").first()
    assert tuple(row) == (MESSAGES, MESSAGES)


def test_report_renders_its_charts_in_headless_chromium(
    report: tuple[str, dict[str, Any], Any, dict[str, int]],
) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (scripts/setup.sh installs `chromium`)")
    tenant, summary, _, _ = report
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
         "--dump-dom", Path(summary["html"]).as_uri()],
        capture_output=True, text=True, timeout=90, check=True,
    ).stdout  # fmt: skip
    # Plotly draws into SVG: the main plot surface, one bar trace group per chart.
    assert 'class="main-svg"' in dom
    assert dom.count('class="trace bars"') >= len(tenant_report.CHARTS) + 1  # + top topics
    assert "Messages in by QoS" in dom and "Top topics over the window" in dom
    assert tenant in dom  # the legend names the tenant
