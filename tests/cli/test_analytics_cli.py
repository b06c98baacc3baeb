"""`starling analytics --data-dir D`: D is the mesh folder, as for every `starling` command
(the store is D/data, the outputs go to D/analytics whatever the working directory); a folder
without a store is refused in one line naming the option, before Spark starts. The first test
is the analytics command in a process of its own, with its own Spark (what a cron entry runs);
tests/analytics runs the jobs, and the command's summary, on the suite's shared session."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.common.store.ports_queue import NewQueueItem
from services.common.store.ports_session import SessionRecord
from services.common.store.sqlite_queue import SqliteQueueStore
from services.common.store.sqlite_router import SqliteRouterStore
from services.common.store.sqlite_session import SqliteSessionStore

ROOT = Path(__file__).resolve().parents[2]


async def _store(data: Path) -> None:
    """A store as a mesh leaves it: one live session whose queue holds 3 expired entries
    (`data` exists)."""
    now = int(time.time() * 1000)
    q = SqliteQueueStore(data / "queues.db")
    epoch = await q.claim_partition(0)
    items = [NewQueueItem(f"e-{i}", 1, b"m", now - 60_000) for i in range(3)]
    await q.append("t", "s#1", items, 0, epoch, 0, False)
    await q.close()
    s = SqliteSessionStore(data / "sessions.db")
    await s.put_session(SessionRecord("t", "s", 1, 3600, False, now))
    await s.close()
    await SqliteRouterStore(data / "router.db").close()


def _analytics(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARLING_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", "analytics", "queue-compaction", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


@pytest.mark.timeout(240)
def test_data_dir_is_the_mesh_folder_and_outputs_go_under_it(tmp_path: Path) -> None:
    mesh = tmp_path / "mesh"
    (mesh / "data").mkdir(parents=True)
    asyncio.run(_store(mesh / "data"))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    done = _analytics(elsewhere, "--data-dir", str(mesh), "--master", "local[1]", "--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    kept = json.loads((mesh / "analytics" / "queue-compaction" / "last-run.json").read_text())
    assert kept["job"] == "queue-compaction" and kept["candidates"]["expired"] == 3
    # The summary printed is the one kept; a dry run removes nothing.
    assert json.loads(done.stdout[done.stdout.index("{") :]) == kept
    assert sum(kept["removed_total"].values()) == 0
    assert list(elsewhere.iterdir()) == []  # nothing relative to the working directory


@pytest.mark.parametrize("given", ["store", "missing", "empty"])
def test_a_folder_without_a_store_is_one_line_naming_the_option(tmp_path: Path, given: str) -> None:
    mesh = tmp_path / "mesh"
    (mesh / "data").mkdir(parents=True)
    asyncio.run(_store(mesh / "data"))
    (tmp_path / "empty").mkdir()
    folder = {"store": mesh / "data", "missing": tmp_path / "nope", "empty": tmp_path / "empty"}
    done = _analytics(tmp_path, "--data-dir", str(folder[given]))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data-dir" in lines[0] and "Traceback" not in done.stderr
    if given == "store":
        assert f"give the mesh folder around it, {mesh}" in lines[0]
