"""Two metrics instances behind one address (issue 18): each node's reports reach them in
turn, and a call the client repeats on the other instance repeats a report. The usage table
counts every message once, and either instance's cluster figures are the latest report of
every reporter (services/metrics/shared.py; Redis from the test session, the usage table on
SQLite as the instances of one machine share it)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from services.common.store.sqlite_usage import SqliteUsageStore
from services.metrics.api import MetricsApi
from services.metrics.client import to_pb
from services.metrics.core import ClusterStats, TenantCounts
from services.metrics.shared import SharedReports, load_latest
from starling.metrics.v1 import metrics_pb2 as pb


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


def _report(node: str, ts_ms: int, tenant: str, messages_in: int, conns: int) -> Any:
    counts = TenantCounts(connections=conns, messages_in=messages_in, msgs_in_q1=messages_in)
    return pb.ReportNodeStatsRequest(node_id=node, ts_ms=ts_ms, tenants=[to_pb(tenant, counts)])


async def test_two_instances_count_each_message_once(redis: Redis, tmp_path: Path) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    nodes = [f"n-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    usage = SqliteUsageStore(tmp_path / "usage.db")
    stats = [ClusterStats(30.0), ClusterStats(30.0)]
    instances = [MetricsApi(s, usage, SharedReports(redis)) for s in stats]
    try:
        ts = int(time.time() * 1000)
        sent = {n: 0 for n in nodes}
        for k in range(12):
            for j, node in enumerate(nodes):
                sent[node] += 10 + j  # cumulative, as nodes report
                req = _report(node, ts + k, tenant, sent[node], 3)
                await instances[(k + j) % 2].ReportNodeStats(req, None)
                if k % 4 == 1:  # a call repeated on the other instance (fail-over)
                    await instances[(k + j + 1) % 2].ReportNodeStats(req, None)
        # A late report (older than the stored one) adds nothing either.
        await instances[0].ReportNodeStats(_report(nodes[0], ts + 3, tenant, 30, 3), None)
        rows = await usage.usage(tenant)
        assert sum(r.messages_in for r in rows) == sum(sent.values()) == 12 * 21
        assert sum(r.msgs_in_q1 for r in rows) == 12 * 21
        # Each instance got half the reports; reloaded from Redis, each shows all of them.
        for s in stats:
            await load_latest(SharedReports(redis), s)
            _, totals = s.totals(time.monotonic())
            assert totals[tenant].messages_in == 12 * 21 and totals[tenant].connections == 6
    finally:
        await usage.close()


async def test_one_instance_without_redis_counts_as_before(tmp_path: Path) -> None:
    usage = SqliteUsageStore(tmp_path / "usage.db")
    api = MetricsApi(ClusterStats(30.0), usage)
    try:
        ts = int(time.time() * 1000)
        for k in range(1, 4):
            await api.ReportNodeStats(_report("n", ts + k, "a", 5 * k, 1), None)
        assert sum(r.messages_in for r in await usage.usage("a")) == 15
    finally:
        await usage.close()
