"""Queue compaction while the shared mesh publishes QoS 1 to offline persistent sessions:
every PUBACKed message still arrives afterwards, and expired entries are what it removed."""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from pyspark.sql import SparkSession

from analytics.config import load_analytics_settings
from analytics.jobs import queue_compaction
from analytics.jobs.context import JobContext
from analytics.source import StoreConf
from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until

SUBSCRIBERS = 6
PER_SUBSCRIBER = 80  # below the mesh's 100-message queue limit
EXPIRING = 20


def _offline(mesh: MeshInfo, tenant: str, cid: str, i: int) -> None:
    c = Paho(mesh.node(i % 2), client_id=cid, username=f"{tenant}/u", password="pw")
    c.connect(clean_start=True, session_expiry=600)
    c.subscribe(f"q/{cid}", 1)
    c.close()


def test_compaction_while_publishing_keeps_every_acknowledged_message(
    mesh: MeshInfo, spark: SparkSession, tmp_path: Path
) -> None:
    tenant = f"cmp{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    cids = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(SUBSCRIBERS)]
    for i, cid in enumerate(cids):
        _offline(mesh, tenant, cid, i)
    short = f"x-{uuid.uuid4().hex[:6]}"
    _offline(mesh, tenant, short, 0)
    pub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub.connect()
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 1
    for i in range(EXPIRING):
        assert pub.publish(f"q/{short}", f"gone{i}", 1, props=props) is not None
    expired_by = time.time() + 1.5  # the entries' expiry (1 s) is past from here on

    acked: dict[str, list[bytes]] = {cid: [] for cid in cids}
    stop = threading.Event()

    def publish() -> None:
        for n in range(PER_SUBSCRIBER):
            for cid in cids:
                payload = f"{cid}:{n}".encode()
                if pub.publish(f"q/{cid}", payload, 1) is not None:  # PUBACKed: a promise
                    acked[cid].append(payload)
            # Spread over the compaction run (pacing only; nothing is timed).
            if stop.wait(0.4) and n >= PER_SUBSCRIBER // 2:
                break

    wait_until(lambda: time.time() >= expired_by, 5, "the entries' expiry")
    writer = threading.Thread(target=publish)
    writer.start()
    data = Path(mesh.mesh.data_dir) / "data"
    settings = load_analytics_settings(
        data_dir=data, analytics_output_dir=tmp_path, analytics_partitions=3
    )
    ctx = JobContext(spark, StoreConf(sqlite=str(data)), settings, tmp_path)

    def count() -> int:
        return sum(len(v) for v in acked.values())

    try:
        before = count()
        summary = queue_compaction.run(ctx, argparse.Namespace(now_ms=0, dry_run=False))
        during = count() - before
    finally:
        stop.set()
        writer.join(120)
    pub.close()
    assert during > 0  # publishes were acknowledged while compaction scanned and deleted
    assert summary["by_tenant"][tenant]["expired"] == EXPIRING
    assert summary["by_tenant"][tenant]["acked"] == 0
    for i, cid in enumerate(cids):
        assert acked[cid], cid
        back = Paho(mesh.node(i % 2), client_id=cid, username=f"{tenant}/u", password="pw")
        back.connect(clean_start=False, session_expiry=600)
        assert back.session_present
        got = [m.payload for m in back.expect(len(acked[cid]), timeout=30)]
        assert got == acked[cid]  # all of them, in order
        back.close()
    gone = Paho(mesh.node(0), client_id=short, username=f"{tenant}/u", password="pw")
    gone.connect(clean_start=False, session_expiry=600)
    gone.nothing(0.5)
    gone.close()
