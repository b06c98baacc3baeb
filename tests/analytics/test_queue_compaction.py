"""Queue compaction over a store written by the real store classes: each category removes
exactly what is dead, keeps everything live (including rows that became live between the
scan and the delete), keeps the queue's depth true, and a second run removes nothing."""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from analytics.config import load_analytics_settings
from analytics.jobs import queue_compaction
from analytics.jobs.context import JobContext
from analytics.source import StoreConf
from services.common.store.ports_queue import NewQueueItem
from services.common.store.ports_router import RetainedRecord
from services.common.store.ports_session import SessionRecord
from services.common.store.sqlite_queue import MSGID_RETENTION_MS, SqliteQueueStore
from services.common.store.sqlite_router import SqliteRouterStore
from services.common.store.sqlite_session import SqliteSessionStore
from tests.analytics.command import run_command

NOW = int(time.time() * 1000)
PAST, FUTURE = NOW - 60_000, NOW + 3_600_000


def _items(prefix: str, expiries: list[int]) -> list[NewQueueItem]:
    return [NewQueueItem(f"{prefix}-{i}", 1, b"m", e) for i, e in enumerate(expiries)]


async def _fill(data: Path) -> None:
    q = SqliteQueueStore(data / "queues.db")
    epoch = await q.claim_partition(0)
    # a: seqs 1-10, acked through 4 by the store, 6 and 8 expired, 10 expires in an hour.
    exp = [0, 0, 0, 0, 0, PAST, 0, PAST, 0, FUTURE]
    await q.append("t1", "a#1", _items("a", exp), 0, epoch, 0, False)
    await q.ack("t1", "a#1", 4)
    # b (t2): an expired session's queue; c#1 an older incarnation of c; c#2 current.
    await q.append("t2", "b#1", _items("b", [0] * 5), 0, epoch, 0, False)
    await q.append("t2", "c#1", _items("c1", [0] * 3), 0, epoch, 0, False)
    await q.append("t2", "c#2", _items("c2", [0, PAST]), 0, epoch, 0, False)
    # d: a live, offline session's queue (expires in an hour): nothing of it goes.
    await q.append("t2", "d#1", _items("d", [0] * 4), 0, epoch, 0, False)
    await q.close()
    s = SqliteSessionStore(data / "sessions.db")
    await s.put_session(SessionRecord("t2", "b", 1, 10, False, NOW - 3_600_000))
    await s.put_session(SessionRecord("t2", "c", 2, 600, True))
    await s.put_session(SessionRecord("t2", "d", 1, 3600, False, NOW))
    await s.close()
    r = SqliteRouterStore(data / "router.db")
    await r.put_retained(RetainedRecord("t1", "r/old", b"x", PAST))
    await r.put_retained(RetainedRecord("t1", "r/new", b"x", FUTURE))
    await r.put_retained(RetainedRecord("t1", "r/forever", b"x", 0))
    await r.put_retained(RetainedRecord("t1", "r/replaced", b"x", PAST))
    await r.close()
    db = sqlite3.connect(data / "queues.db")
    # An ack whose delete did not land (seq 2 back, below acked_through 4), and old msgids.
    db.execute("INSERT INTO queue_entries VALUES ('t1','a#1',0,2,'a-1',1,x'6d',0,0)")
    db.execute(
        "UPDATE queue_msgids SET created_at_ms=? WHERE queue_id='a#1'",
        (NOW - MSGID_RETENTION_MS - 1000,),
    )
    db.commit()
    db.close()


def _ctx(spark: SparkSession, data: Path) -> JobContext:
    settings = load_analytics_settings(
        data_dir=data, analytics_output_dir=data / "out", analytics_partitions=3
    )
    return JobContext(spark, StoreConf(sqlite=str(data)), settings, data / "out")


def _rows(data: Path, sql: str) -> list[Any]:
    with sqlite3.connect(data / "queues.db") as db:
        return db.execute(sql).fetchall()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    asyncio.run(_fill(tmp_path))
    return tmp_path


def test_compaction_removes_dead_rows_only(spark: SparkSession, data: Path) -> None:
    ctx = _ctx(spark, data)
    # The scan, materialised now (the job streams it, so its scan and deletes interleave).
    found = {
        k: spark.createDataFrame(v.collect(), v.schema)
        for k, v in queue_compaction.candidates(ctx, NOW).items()
    }
    # Between the scan and the delete, r/replaced gets a new retained message: it must stay.
    with sqlite3.connect(data / "router.db") as db:
        db.execute("UPDATE retained SET expires_at_ms=0, data=x'79' WHERE topic='r/replaced'")
    tally = queue_compaction.delete_sqlite(ctx, found, NOW)
    removed = tally.removed
    assert tally.planned["retained"] == 2  # r/replaced was a candidate
    assert tally.planned["expired"] == 3 and tally.planned["session_queues"] == 8
    assert dict(removed["acked"]) == {"t1": 1}
    assert dict(removed["expired"]) == {"t1": 2, "t2": 1}
    assert dict(removed["session_queues"]) == {"t2": 5 + 3}
    assert dict(removed["retained"]) == {"t1": 1}
    assert dict(removed["msgids"]) == {"t1": 10}
    left = _rows(data, "SELECT queue_id, seq FROM queue_entries ORDER BY queue_id, seq")
    assert left == [
        ("a#1", 5), ("a#1", 7), ("a#1", 9), ("a#1", 10),
        ("c#2", 1),
        ("d#1", 1), ("d#1", 2), ("d#1", 3), ("d#1", 4),
    ]  # fmt: skip
    # Depth is the rows left, so a later ack and the depth limit still add up.
    depth = dict(_rows(data, "SELECT queue_id, depth FROM queue_state"))
    assert depth == {"a#1": 4, "c#2": 1, "d#1": 4}
    # And bytes are what the rows left hold (the tenant's max_queued_bytes counts these).
    held = dict(_rows(data, "SELECT queue_id, bytes FROM queue_state"))
    stored = _rows(
        data,
        "SELECT e.queue_id, sum(length(e.data)) FROM queue_entries e JOIN queue_state s "
        "USING (tenant, queue_id) WHERE e.seq > s.acked_through GROUP BY e.queue_id",
    )
    assert held == dict(stored) and held["a#1"] > 0
    assert _rows(data, "SELECT count(*) FROM queue_msgids WHERE queue_id IN ('b#1','c#1')") == [
        (0,)
    ]
    with sqlite3.connect(data / "router.db") as db:
        topics = sorted(r[0] for r in db.execute("SELECT topic FROM retained"))
    assert topics == ["r/forever", "r/new", "r/replaced"]


def test_second_run_removes_nothing_and_reports(spark: SparkSession, data: Path) -> None:
    ctx = _ctx(spark, data)
    args = argparse.Namespace(now_ms=NOW, dry_run=False)
    first = queue_compaction.run(ctx, args)
    assert first["removed_total"] == {
        "acked": 1, "expired": 3, "session_queues": 8, "retained": 2, "msgids": 10,
    }  # fmt: skip
    assert first["by_tenant"]["t2"]["session_queues"] == 8
    assert first["candidates"]["expired"] == 3
    again = queue_compaction.run(ctx, args)
    assert sum(again["removed_total"].values()) == 0
    assert again["entries_scanned"] == 9


@pytest.fixture(scope="module")
def dry_run(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, str]:
    """`starling analytics queue-compaction --dry-run` run once, in this process on the
    shared session (the command in a process of its own: tests/cli/test_analytics_cli.py),
    over a store of its own: the store, the output folder and what the command printed."""
    data = tmp_path_factory.mktemp("dry")
    asyncio.run(_fill(data))
    out = data / "cli-out"
    argv = ["queue-compaction", "--output", str(out), "--dry-run", "--now-ms", str(NOW)]
    # `data` is a store folder: the data_dir setting (--data-dir names a mesh folder).
    env = {"STARLING_DATA_DIR": str(data), "STARLING_ANALYTICS_PARTITIONS": "3"}
    return data, out, run_command(spark, argv, env)


def test_dry_run_deletes_nothing(dry_run: tuple[Path, Path, str]) -> None:
    data, out, _ = dry_run
    kept = json.loads((out / "queue-compaction" / "last-run.json").read_text())
    assert kept["candidates"]["session_queues"] == 8 and kept["candidates"]["expired"] == 3
    assert _rows(data, "SELECT count(*) FROM queue_entries") == [(10 + 1 - 4 + 5 + 3 + 2 + 4,)]


def test_analytics_command_prints_and_keeps_its_summary(dry_run: tuple[Path, Path, str]) -> None:
    """What a cron entry's command leaves: the summary printed and kept as last-run.json in
    the --output folder."""
    _, out, printed = dry_run
    kept = json.loads((out / "queue-compaction" / "last-run.json").read_text())
    assert kept["job"] == "queue-compaction" and kept["candidates"]["session_queues"] == 8
    assert json.loads(printed[printed.index("{") :]) == kept
    assert sum(kept["removed_total"].values()) == 0  # a dry run
