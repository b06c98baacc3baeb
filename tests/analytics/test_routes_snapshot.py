"""The `routes-snapshot` job on real PySpark (local mode): its snapshot plus the log tail is
the subscriptions table; it is idempotent; and a router restarted after it (run as
`starling analytics routes-snapshot --data-dir MESH` runs it, on the shared session), in a
real mesh whose subscriptions came from real MQTT clients, boots from it and delivers to
every subscriber."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from analytics.jobs.routes_snapshot import NAME, compact_with_spark
from analytics.source import StoreConf
from services.cli.launcher import Launcher
from services.common.route_table import RouteTable
from services.common.rpc.credentials import MESH_METADATA_KEY, mesh_metadata, set_mesh_secret
from services.common.store.sqlite_session import SqliteSessionStore
from services.router.boot import load_routes
from services.router.client import Route, RouterAdminClient
from services.router.compaction import compact
from tests.analytics.command import run_command
from tests.e2e.clients import Paho
from tests.poll import eventually
from tests.router.test_boot import _change, _records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TENANT = "default"  # what anonymous clients of the launcher's mesh get


async def test_job_snapshot_plus_tail_is_the_table_and_reruns_cleanly(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = SqliteSessionStore(tmp_path / "sessions.db")
    try:
        rng = random.Random(4)
        for _ in range(400):
            await _change(store, rng)
        conf = StoreConf(sqlite=str(tmp_path))
        first = await compact_with_spark(spark, store, conf, partitions=3)
        assert first["subscriptions"] == len(await store.all_subscriptions())
        for _ in range(100):  # the tail the boot replays
            await _change(store, rng)
        table = RouteTable()
        report = await load_routes(store, table)
        assert report.source == "snapshot" and report.checkpoint == first["checkpoint"]
        assert report.replayed >= 100
        assert _records(table) == set(await store.all_subscriptions())

        # Run again: a newer snapshot, the same routes; the Spark-made parts decode to what
        # the in-process compaction makes of the same table.
        second = await compact_with_spark(spark, store, conf, partitions=2)
        assert second["snapshot_id"] > first["snapshot_id"]
        again = RouteTable()
        assert (await load_routes(store, again)).replayed == 0
        await compact(store)
        local = RouteTable()
        await load_routes(store, local)
        assert _records(again) == _records(local) == set(await store.all_subscriptions())
    finally:
        await store.close()


@pytest.fixture
def small_mesh(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(
        data_dir=tmp_path / "run",
        nodes=1,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={"STARLING_LOG_LEVEL": "INFO"},
    )
    launcher.start(timeout_s=60)
    try:
        yield launcher
    finally:
        launcher.stop()


def _restart(launcher: Launcher, name: str) -> None:
    # From a thread that outlives the child (Launcher.restart says why): a plain thread
    # that ends once the service serves would take the child down with it.
    done = threading.Event()
    errors: list[BaseException] = []

    def go() -> None:
        try:
            launcher.restart(name)
        except BaseException as exc:
            errors.append(exc)
        done.set()
        threading.Event().wait()  # outlive the child for the rest of the test run

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(60)
    assert not errors, errors


async def _persistent_routes(admin: RouterAdminClient) -> set[Route]:
    return {r for r in await admin.list_routes(TENANT) if r.persistent}


def _subscribers(port: int) -> tuple[list[tuple[Paho, str]], Paho]:
    """Six persistent sessions, each on its own topic and on one of two shared filters; and
    one more that subscribed and unsubscribed (its UNSUBSCRIBE is answered asynchronously)."""
    subscribers: list[tuple[Paho, str]] = []
    for i in range(6):
        c = Paho(port, client_id=f"snap-{i}")
        c.connect(clean_start=False, session_expiry=3600)
        topic = f"fleet/{i}/cmd"
        c.subscribe(topic, qos=1)
        c.subscribe(f"fleet/+/all/{i % 2}", qos=1)
        subscribers.append((c, topic))
    one_off = Paho(port, client_id="snap-gone")
    one_off.connect(clean_start=False, session_expiry=3600)
    one_off.subscribe("fleet/gone", qos=1)
    one_off.c.unsubscribe("fleet/gone")
    return subscribers, one_off


def _snapshot(spark: SparkSession, launcher: Launcher) -> dict[str, Any]:
    """`starling analytics routes-snapshot --data-dir MESH`, in this process on the shared
    session: the job on the mesh's session store; the summary it printed (and kept)."""
    argv = [NAME, "--data-dir", str(launcher.data_dir)]
    summary: dict[str, Any] = json.loads(run_command(spark, argv))
    kept = Path(launcher.data_dir) / "analytics" / NAME / "last-run.json"
    assert json.loads(kept.read_text()) == summary
    return summary


def _check_delivered_to_every_subscriber(port: int, subscribers: list[tuple[Paho, str]]) -> None:
    publisher = Paho(port, client_id="snap-pub")
    publisher.connect()
    for c, topic in subscribers:
        publisher.publish(topic, f"to {c.client_id}".encode(), qos=1)
    publisher.publish("fleet/x/all/0", b"even", qos=1)
    for i, (c, _) in enumerate(subscribers):
        own = f"to {c.client_id}".encode()
        if i % 2 == 0:  # also subscribed to fleet/+/all/0
            assert sorted(m.payload for m in c.expect(2)) == sorted([own, b"even"])
        else:
            assert [m.payload for m in c.expect(1)] == [own]
            c.nothing()
    publisher.close()


async def test_router_restarted_after_the_job_serves_the_same_routes(
    spark: SparkSession, small_mesh: Launcher
) -> None:
    port = small_mesh.mesh.by_name("connection-0").port
    subscribers, one_off = _subscribers(port)
    # This process's calls carry the small mesh's secret for the test only (it is
    # process-wide: the suite's in-process services expect theirs afterwards).
    before_secret = dict(mesh_metadata()).get(MESH_METADATA_KEY, "")
    set_mesh_secret(small_mesh.secrets.mesh_secret)
    admin = RouterAdminClient(f"127.0.0.1:{small_mesh.mesh.by_name('router').grpc_port}",
                              small_mesh.admin_token)  # fmt: skip
    try:

        async def unsubscribed() -> set[Route]:
            routes = await _persistent_routes(admin)
            return routes if all(r.topic_filter != "fleet/gone" for r in routes) else set()

        # The UNSUBSCRIBE is answered asynchronously.
        before = await eventually(unsubscribed, 10, "fleet/gone unsubscribed", every_s=0.05)
        assert len(before) == 8  # 6 own filters + 2 shared ones
        summary = await asyncio.to_thread(_snapshot, spark, small_mesh)
        assert summary["subscriptions"] == 12

        await asyncio.to_thread(_restart, small_mesh, "router")
        after = await _persistent_routes(admin)
        assert after == before
        text = await asyncio.to_thread(Path(small_mesh.mesh.by_name("router").log).read_text)
        loaded = [line for line in text.splitlines() if "route_table_loaded" in line]
        assert len(loaded) == 2 and "snapshot" in loaded[-1] and "scan" in loaded[0]
        _check_delivered_to_every_subscriber(port, subscribers)
    finally:
        set_mesh_secret(before_secret)
        await admin.close()
        for c, _ in subscribers:
            c.close()
        one_off.close()
