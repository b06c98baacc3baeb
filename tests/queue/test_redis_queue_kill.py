"""Kill tests of the Redis Streams queue backend: a two-node mesh whose tenants' queues are all
on Redis (`STARLING_QUEUE_STORE_DEFAULT=redis`, services/common/store/tenant_queues.py), on a
redis-server of their own (`STARLING_QUEUE_REDIS_URL`) with `appendonly yes` and `appendfsync
always`, while the fault suite's load runs (QoS 1 and 2 publishers, persistent subscribers on
both nodes; tests/faults/harness.py): the queue service SIGKILLed and started again, then
that Redis SIGKILLed and started again from its AOF. Each time nothing acknowledged is lost,
no QoS 2 message arrives twice and each publisher's order holds; the queues were in that
Redis, not in the SQLite file (docs/storage.md, "Redis Streams queues")."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis import Redis

from services.cli.launcher import Launcher
from services.cli.ports import free_port
from tests.conftest import wait_port
from tests.faults.harness import fault_launcher, run_under_load

pytestmark = pytest.mark.timeout(300)
PASSWORD = "tests-queue-redis-password"
DOWN_S = 2.0  # how long the queues' Redis stays dead


@dataclass
class DurableRedis:
    """A redis-server that fsyncs its AOF before it answers a write."""

    folder: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.folder)]
        self.proc = subprocess.Popen(
            [binary, *args, "--requirepass", PASSWORD],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, self.proc, "the queues' redis-server")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def queues_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DurableRedis]:
    redis = DurableRedis(tmp_path_factory.mktemp("queues-redis"), free_port())
    redis.start()
    yield redis
    redis.kill()


@pytest.fixture(scope="module")
def redis_queues_mesh(
    tmp_path_factory: pytest.TempPathFactory, queues_redis: DurableRedis
) -> Iterator[Launcher]:
    folder = tmp_path_factory.mktemp("redis-queues")
    env = {"STARLING_QUEUE_STORE_DEFAULT": "redis", "STARLING_QUEUE_REDIS_URL": queues_redis.url}
    with fault_launcher(folder, **env) as launcher:
        yield launcher


def _queues_were_on_redis(launcher: Launcher, redis: DurableRedis) -> None:
    with Redis(port=redis.port, password=PASSWORD) as r:
        assert any(True for _ in r.scan_iter(match="st:q:{7:default:*}:st", count=1000))
    db = Path(launcher.mesh.data_dir) / "data" / "queues.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT count(*) FROM queue_state WHERE tenant='default'")
        assert rows.fetchone()[0] == 0


def test_sigkill_of_the_queue_service_with_queues_on_redis(
    redis_queues_mesh: Launcher, queues_redis: DurableRedis
) -> None:
    launcher = redis_queues_mesh

    def restart_queue(_: object) -> None:
        pid = launcher.procs["queue"].pid
        launcher.kill("queue")
        launcher.restart("queue")
        assert launcher.procs["queue"].pid != pid

    run_under_load(
        launcher,
        "queue SIGKILL (Redis Streams queues)",
        "queue service SIGKILLed and started again, every tenant's queues on Redis",
        restart_queue,
    )
    _queues_were_on_redis(launcher, queues_redis)


def test_sigkill_of_the_queues_redis(
    redis_queues_mesh: Launcher, queues_redis: DurableRedis
) -> None:
    def restart_redis(_: object) -> None:
        queues_redis.kill()
        time.sleep(DOWN_S)  # the outage itself: appends, reads and acks fail meanwhile
        queues_redis.start()

    run_under_load(
        redis_queues_mesh,
        "queues' Redis SIGKILL (appendfsync always)",
        f"the queues' redis-server SIGKILLed, down {DOWN_S} s, restarted from its AOF",
        restart_redis,
    )
    _queues_were_on_redis(redis_queues_mesh, queues_redis)
