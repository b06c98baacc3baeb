"""Two queue instances (`starling up --queues 2`): one is SIGKILLed while QoS 1 and QoS 2
messages flow from publishers on both nodes to persistent sessions on both nodes. Its
partitions move to the other instance when its lease runs out (services/queue/leases.py);
appends under way at it end when the new owner announces itself and go there. Nothing
acknowledged is lost, each publisher's order holds, and the pause in acknowledgements around
the kill is measured (a figure in the fault suite's table; the bound asserted is loose, far
above the target of 2 s, so that a loaded machine cannot fail it). The killed instance then
comes back under the same load and takes its share again: nothing lost there either. Then
the cluster's queue depth figure (each instance reports the partitions it owns) matches what
the store holds for the tenant. And a tenant's max_queued_bytes holds across the two
instances (each announces its bytes per tenant; services/queue/depths.py).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from services.cli.launcher import Launcher
from services.cli.status import component_status
from services.common.bus import subjects
from services.quota.client import Limits, QuotaAdminClient
from starling.queue.v1 import queue_pb2
from tests.e2e.clients import Paho
from tests.faults import harness
from tests.faults.checker import Checker
from tests.faults.harness import MAX_PACKET, Load, record
from tests.poll import holds_within, wait_until

pytestmark = pytest.mark.timeout(180)


class TimedChecker(Checker):
    """Also remembers when each publisher got each acknowledgement."""

    def __init__(self) -> None:
        super().__init__()
        self.ack_times: dict[str, list[float]] = defaultdict(list)

    def acked(self, publisher: str, seq: int) -> None:
        super().acked(publisher, seq)
        self.ack_times[publisher].append(time.monotonic())


def pause_around(times: list[float], at: float) -> float:
    """How long after `at` the first acknowledgement after the longest silence that began
    before `at` came (0.0 if acknowledgements never stopped)."""
    before = [t for t in times if t <= at]
    after = [t for t in times if t > at]
    if not after:
        return float("inf")
    last = before[-1] if before else at
    return max(0.0, after[0] - max(last, at)) if after[0] - last > 0.2 else 0.0


def owned_partitions(launcher: Launcher, name: str) -> int:
    """How many partitions the current process of queue instance `name` last said it owns
    (its log's queue_partitions_changed lines since it started)."""
    owned = 0
    for line in Path(launcher.mesh.by_name(name).log).read_text().splitlines():
        if '"service_config"' in line:
            owned = 0  # a new process
        elif '"queue_partitions_changed"' in line:
            owned = json.loads(line)["owned"]
    return owned


@pytest.fixture(scope="module")
def two_queues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("queues2")
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        instances={"queue": 2},
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
        },
    )
    launcher.start(timeout_s=60)
    try:
        yield launcher
    finally:
        launcher.stop()


def test_sigkill_of_a_queue_instance_under_load(
    two_queues: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = two_queues
    assert component_status(launcher.mesh.by_name("queue-1")) == "SERVING"
    checker = TimedChecker()
    monkeypatch.setattr(harness, "Checker", lambda: checker)
    load = Load(launcher)
    try:
        load.start()
        # Both instances own partitions and take appends (the load flows already).
        wait_until(lambda: owned_partitions(launcher, "queue-1") > 0, 10, "queue-1's partitions")
        killed_at = time.monotonic()
        launcher.kill("queue-1")
        time.sleep(4.0)  # thousands of messages across the kill
        # It comes back under load: the survivor gives half its partitions up (appends
        # under way there finish first) and queue-1 claims them.
        launcher.restart("queue-1")
        assert holds_within(lambda: owned_partitions(launcher, "queue-1") > 0, 10)
        time.sleep(2.0)
        verdict = load.finish(45.0)
    except BaseException:
        load.close()
        raise
    pauses = {
        name: round(pause_around(checker.ack_times[name], killed_at), 2)
        for name in checker.ack_times
    }
    unacked = {p.name: p.unacked() for p in load.publishers if p.unacked()}
    record(
        "queue instance SIGKILL (2 instances)",
        "queue-1 of 2 queue instances SIGKILLed",
        verdict,
        ack_pause_s=pauses,
        reconnects=load.reconnects(),
        unacked=unacked,
    )
    verdict.check()
    assert not unacked, f"publishes never acknowledged: {unacked}"
    assert verdict.acked >= 2000, verdict.summary()
    # The target is 2 s (lease 1.2 s + a round); asserted loosely, reported exactly.
    assert max(pauses.values()) < 8.0, pauses
    _depths_add_up(launcher, load.base)


def _depths_add_up(launcher: Launcher, base: str) -> None:
    """Partitions moved to the survivor and back under load: the instances' depth reports
    still add up to the store's counters (the load runs as the anonymous tenant), with
    messages waiting for the two persistent subscribers, now offline."""
    pub = Paho(launcher.mesh.by_name("connection-0").port)
    pub.connect()
    for i in range(10):
        pub.publish(f"{base}/after", b"%d" % i, 1)
    pub.close()
    assert holds_within(lambda: stored_depth(launcher, "default") >= 20, 10)

    def figures() -> tuple[int, int]:
        return cluster_depth(launcher, "default"), stored_depth(launcher, "default")

    assert holds_within(lambda: len(set(figures())) == 1, 30), figures()


def stored_depth(launcher: Launcher, tenant: str) -> int:
    """The tenant's entries waiting, summed from the queue store's own counters."""
    db = Path(launcher.mesh.data_dir) / "data" / "queues.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT sum(depth) FROM queue_state WHERE tenant=?", (tenant,))
        return int(row.fetchone()[0] or 0)


def cluster_depth(launcher: Launcher, tenant: str) -> int:
    """starling_cluster_queue_depth{tenant} on the metrics service's cluster endpoint."""
    port = launcher.mesh.by_name("metrics").port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "starling_cluster_queue_depth" and s.labels.get("tenant") == tenant:
                return int(s.value)
    return 0


class Announcements(threading.Thread):
    """The queue instances' ctl.queue.bytes announcements, as the operator sees them on
    NATS: per instance, when it last announced and its figures."""

    def __init__(self, launcher: Launcher) -> None:
        super().__init__(daemon=True)
        password = launcher.secrets.nats["operator"]
        self.url = f"nats://operator:{password}@127.0.0.1:{launcher.mesh.by_name('nats').port}"
        self.heard: dict[str, tuple[float, dict[str, int]]] = {}
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._done: asyncio.Event | None = None

    def run(self) -> None:
        self.loop.run_until_complete(self._listen())

    def stop(self) -> None:
        """Close the connection (before the mesh stops: no reconnect attempts after)."""
        if self._done is not None:
            self.loop.call_soon_threadsafe(self._done.set)
        self.join(5)

    async def _listen(self) -> None:
        self._done = asyncio.Event()
        nc = await nats.connect(self.url)

        async def on(msg: Msg) -> None:
            b = queue_pb2.QueuedBytes.FromString(msg.data)
            self.heard[b.instance_id] = (time.monotonic(), dict(b.bytes_by_tenant))

        await nc.subscribe(subjects.QUEUED_BYTES, cb=on)
        self.ready.set()
        await self._done.wait()
        await nc.close()

    def all_since(self, t: float) -> bool:
        """Whether two instances announced after `t`."""
        return sum(1 for when, _ in self.heard.values() if when > t) >= 2


def test_queued_bytes_are_held_to_the_limit_across_instances(two_queues: Launcher) -> None:
    """A tenant's queues spread over both instances' partitions: with each publish's bytes
    announced before the next, the cluster stops at the limit, not at the limit per
    instance (each instance alone would take up to it)."""
    launcher = two_queues
    assert holds_within(lambda: owned_partitions(launcher, "queue-1") > 0, 10)
    tenant, limit = f"b{uuid.uuid4().hex[:8]}", 40_000

    async def set_limit() -> None:
        c = QuotaAdminClient(
            f"127.0.0.1:{launcher.mesh.by_name('quota').grpc_port}", launcher.admin_token
        )
        try:
            await c.set_limits(tenant, Limits(max_queued_bytes=limit))
        finally:
            await c.close()

    asyncio.run(set_limit())
    heard = Announcements(launcher)
    heard.start()
    assert heard.ready.wait(10)
    try:
        _fill_to_the_limit(launcher, tenant, limit, heard)
    finally:
        heard.stop()


def _fill_to_the_limit(launcher: Launcher, tenant: str, limit: int, heard: Announcements) -> None:
    """Twelve offline sessions of `tenant`, then 1000-byte QoS 1 publishes to all of them,
    each announced by both instances before the next, until one is refused."""
    port = launcher.mesh.by_name("connection-0").port
    for i in range(12):  # offline sessions: their queues keep what they are sent
        s = Paho(port, client_id=f"s{i}", username=f"{tenant}/dev")
        s.connect(clean_start=False, session_expiry=300)
        s.subscribe("b/#", 1)
        s.close()
    pub = Paho(port, username=f"{tenant}/dev")
    pub.connect()
    codes: list[int] = []
    while not codes or codes[-1] == 0:
        assert len(codes) < 10, codes
        codes.append(pub.publish("b/x", b"p" * 1000, 1).value)
        after = time.monotonic()
        assert holds_within(partial(heard.all_since, after), 5), "the instances did not announce"
    pub.close()
    stored = stored_bytes(launcher, tenant)
    per_message = stored // (len(codes) - 1)
    assert len(codes) >= 3 and stored <= limit < stored + per_message, (codes, stored)
    # Both instances held some of it: the limit was held across them.
    holding = [f for _, f in heard.heard.values() if f.get(tenant)]
    assert len(holding) == 2, heard.heard


def stored_bytes(launcher: Launcher, tenant: str) -> int:
    """The tenant's queued bytes, summed from the queue store's own counters."""
    db = Path(launcher.mesh.data_dir) / "data" / "queues.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT sum(bytes) FROM queue_state WHERE tenant=?", (tenant,))
        return int(row.fetchone()[0] or 0)
