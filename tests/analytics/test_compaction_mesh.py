"""Queue compaction while the shared mesh publishes QoS 1 to offline persistent sessions:
every PUBACKed message still arrives afterwards, and expired entries are what it removed."""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from typing import Any

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
PER_SUBSCRIBER = 80  # at most; below the mesh's 100-message queue limit
AFTER_STOP = 2  # rounds after the compaction ended
EXPIRING = 20


def _offline(mesh: MeshInfo, tenant: str, cid: str, i: int) -> None:
    c = Paho(mesh.node(i % 2), client_id=cid, username=f"{tenant}/u", password="pw")
    c.connect(clean_start=True, session_expiry=600)
    c.subscribe(f"q/{cid}", 1)
    c.close()


def _publish_expiring(pub: Paho, short: str) -> float:
    """EXPIRING messages with a 1 s expiry to `short`; when they are past it."""
    props = PahoProps(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 1
    for i in range(EXPIRING):
        assert pub.publish(f"q/{short}", f"gone{i}", 1, props=props) is not None
    return time.time() + 1.5  # the entries' expiry (1 s) is past from here on


class Writer(threading.Thread):
    """Rounds of a QoS 1 publish to each offline session, spread over the compaction run
    until `stop`, then AFTER_STOP rounds more (PER_SUBSCRIBER at most); `acked`: the
    PUBACKed ones."""

    def __init__(self, pub: Paho, cids: list[str]) -> None:
        super().__init__()
        self.pub, self.cids = pub, cids
        self.acked: dict[str, list[bytes]] = {cid: [] for cid in cids}
        self.stop = threading.Event()

    def run(self) -> None:
        after = 0
        for n in range(PER_SUBSCRIBER):
            for cid in self.cids:
                payload = f"{cid}:{n}".encode()
                if self.pub.publish(f"q/{cid}", payload, 1) is not None:  # PUBACKed: a promise
                    self.acked[cid].append(payload)
            # Spread over the compaction run (pacing only; nothing is timed).
            if self.stop.wait(0.4):
                after += 1
                if after > AFTER_STOP:
                    break

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def _compact_while_publishing(
    mesh: MeshInfo, spark: SparkSession, tmp_path: Path, writer: Writer
) -> tuple[dict[str, Any], int]:
    """Run the compaction job with `writer` publishing; its summary, and how many publishes
    were acknowledged while it ran."""
    writer.start()
    data = Path(mesh.mesh.data_dir) / "data"
    settings = load_analytics_settings(
        data_dir=data, analytics_output_dir=tmp_path, analytics_partitions=3
    )
    ctx = JobContext(spark, StoreConf(sqlite=str(data)), settings, tmp_path)
    try:
        before = writer.count()
        summary = queue_compaction.run(ctx, argparse.Namespace(now_ms=0, dry_run=False))
        during = writer.count() - before
    finally:
        writer.stop.set()
        writer.join(120)
    return summary, during


def _check_every_acked_message_arrives(
    mesh: MeshInfo, tenant: str, acked: dict[str, list[bytes]]
) -> None:
    for i, (cid, sent) in enumerate(acked.items()):
        assert sent, cid
        back = Paho(mesh.node(i % 2), client_id=cid, username=f"{tenant}/u", password="pw")
        back.connect(clean_start=False, session_expiry=600)
        assert back.session_present
        got = [m.payload for m in back.expect(len(sent), timeout=30)]
        assert got == sent  # all of them, in order
        back.close()


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
    expired_by = _publish_expiring(pub, short)
    wait_until(lambda: time.time() >= expired_by, 5, "the entries' expiry")
    writer = Writer(pub, cids)
    summary, during = _compact_while_publishing(mesh, spark, tmp_path, writer)
    pub.close()
    assert during > 0  # publishes were acknowledged while compaction scanned and deleted
    assert summary["by_tenant"][tenant]["expired"] == EXPIRING
    assert summary["by_tenant"][tenant]["acked"] == 0
    _check_every_acked_message_arrives(mesh, tenant, writer.acked)
    gone = Paho(mesh.node(0), client_id=short, username=f"{tenant}/u", password="pw")
    gone.connect(clean_start=False, session_expiry=600)
    gone.nothing(0.5)
    gone.close()
