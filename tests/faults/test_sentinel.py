"""The Redis primary of a Sentinel setup is killed under load (`starling up --redis sentinel`:
a primary, two replicas, three Sentinels).

Load: the fault suite's publishers (QoS 1 and 2) and persistent subscribers
(tests/faults/harness.py), and a CONNECT storm: workers connect a few hundred client ids in
turn on both nodes, keeping every connection, so each CONNECT is a takeover of the client
id's previous connection. The primary is SIGKILLed once the storm runs. Asserted: CONNECTs
succeed again (the time from the kill to the first success of a CONNECT sent after it is
printed: the failover as a client sees it), every acknowledged message reaches the
persistent subscribers, and no client id ends with two live connections.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from services.cli.redis_sentinel import primary_port
from services.common.mqtt import ConnAck, Connect
from tests.e2e.clients import Raw
from tests.faults.harness import MAX_PACKET, Load, run_under_load
from tests.poll import holds_within, wait_until

# Failover times are measured: with nothing else running (docs/testing.md).
pytestmark = pytest.mark.timed

STORM_WORKERS = 6
IDS_PER_WORKER = 40  # 240 client ids


@dataclass
class Storm:
    """CONNECTs in a loop (see the module's docstring); `attempts` holds (sent, answered, ok)
    of each; `held` every accepted connection of each client id, in order."""

    ports: list[int]
    attempts: list[tuple[float, float, bool]] = field(default_factory=list)
    held: dict[str, list[Raw]] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        base = uuid.uuid4().hex[:6]
        for w in range(STORM_WORKERS):
            ids = [f"storm-{base}-{w}-{i}" for i in range(IDS_PER_WORKER)]
            for cid in ids:
                self.held[cid] = []
            t = threading.Thread(target=self._run, args=(w, ids), daemon=True)
            t.start()
            self.workers.append(t)

    def _run(self, worker: int, ids: list[str]) -> None:
        turn = worker
        while not self.stopping.is_set():
            for cid in ids:
                if self.stopping.is_set():
                    return
                turn += 1
                self._connect(cid, self.ports[turn % len(self.ports)])

    def _connect(self, cid: str, port: int) -> None:
        sent = time.monotonic()
        ok = False
        try:
            raw = Raw(port)
            ack = raw.connect(Connect(cid, 5, clean_start=True, keepalive_s=60))
            ok = isinstance(ack, ConnAck) and ack.reason_code == 0
        except (OSError, TimeoutError):
            raw = None
        self.attempts.append((sent, time.monotonic(), ok))
        if ok and raw is not None:
            self.held[cid].append(raw)
        elif raw is not None:
            raw.close()

    def succeeded_since(self, since: float) -> list[float]:
        """When each CONNECT sent after `since` was accepted."""
        return [done for sent, done, ok in list(self.attempts) if ok and sent > since]

    def stop(self) -> None:
        self.stopping.set()
        for t in self.workers:
            t.join(30)

    def live_twice(self) -> dict[str, int]:
        """Client ids with more than one connection the server has not closed."""
        out = {}
        for cid, conns in self.held.items():
            live = sum(1 for raw in conns if not raw.closed(0.005))
            if live > 1:
                out[cid] = live
        return out

    def close(self) -> None:
        for conns in self.held.values():
            for raw in conns:
                raw.close()


@pytest.fixture(scope="module")
def sentinel_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("sentinel")
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
        },
        redis="sentinel",
    )
    launcher.start(timeout_s=90)
    try:
        yield launcher
    finally:
        launcher.stop()


def test_primary_killed_under_a_connect_storm(sentinel_mesh: Launcher) -> None:
    launcher = sentinel_mesh
    local = launcher.local_redis
    assert local is not None and local.sentinel_ports is not None
    ports = [launcher.mesh.by_name(f"connection-{i}").port for i in range(2)]
    storm = Storm(ports)
    figures: dict[str, float] = {}

    def inject(load: Load) -> None:
        storm.start()
        assert holds_within(lambda: len(storm.succeeded_since(0)) >= 200, 30), "no storm"
        primary = primary_port(local.sentinel_ports, local.password)
        victim = next(c.name for c in launcher.mesh.components if c.port == primary)
        killed = time.monotonic()
        launcher.kill(victim)
        # CONNECTs resume: one sent after the kill is accepted.
        wait_until(lambda: storm.succeeded_since(killed), 60, "CONNECTs after the failover")
        figures["failover_s"] = min(storm.succeeded_since(killed)) - killed
        # The Sentinels' own view may lag the clients' (a CONNECT can come through first).
        wait_until(
            lambda: primary_port(local.sentinel_ports, local.password) not in (0, primary),
            30,
            "the Sentinels to promote a replica",
        )
        # The storm goes on a while on the new primary, then stops.
        resumed = len(storm.succeeded_since(killed))
        wait_until(lambda: len(storm.succeeded_since(killed)) >= resumed + 100, 60)
        storm.stop()

    try:
        verdict = run_under_load(
            launcher,
            "sentinel_primary_killed",
            "redis primary SIGKILL",
            inject,
            figures=figures,
        )
        accepted = sum(1 for _, _, ok in storm.attempts if ok)
        print(
            f"\nsentinel failover: CONNECTs accepted again {figures['failover_s']:.1f} s after "
            f"the primary was killed; storm: {len(storm.attempts)} CONNECTs, {accepted} "
            f"accepted; load: {verdict.acked} acknowledged, {verdict.lost} lost"
        )
        # Takeovers settle (kicks travel over NATS): then one live connection per client id.
        settled = holds_within(lambda: not storm.live_twice(), 15)
        assert settled, f"client ids with two live connections: {storm.live_twice()}"
    finally:
        storm.stop()
        storm.close()
