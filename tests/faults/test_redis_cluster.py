"""The mesh on a three-primary Redis Cluster (`Launcher(redis="cluster")`, no replicas), and
one primary SIGKILLed under a CONNECT storm and QoS 1/2 traffic to persistent sessions.

The primary killed is the one that holds the slot of the tenant every client is in
(`{default}`): the registry, quota counters and flapping counts of the whole load. While it
is down, CONNECTs of that tenant wait (the services retry Redis for `redis_failover_wait_s`)
or are refused with 0x88; the other shards serve. It comes back empty (no persistence) with
its slots (its nodes.conf): the tenant's generation sentinel is gone, so the session service
asks every node to re-assert its connections, and a client connected on node 0 before the
loss and again on node 1 after it keeps only the later connection (0x8E to the other).
Checked: CONNECTs succeed again, no duplicate live session, every acknowledged message
arrives in order at the persistent sessions (the fault suite's checker). Printed: how long
CONNECTs failed, from the kill and from the restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.crc import key_slot

from services.cli.launcher import Launcher
from services.common.mqtt import ConnAck, Connect, Disconnect
from tests.e2e.clients import Paho, Raw
from tests.faults.harness import MAX_PACKET, Load, node_ports, run_under_load
from tests.poll import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.timed]

DOWN_S = 3.0  # how long the primary stays down (the fault, not a timing check)
DUPLICATE_PAIRS = 6


@pytest.fixture(scope="module")
def cluster_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(
        data_dir=tmp_path_factory.mktemp("redis-cluster-mesh") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
        },
        redis="cluster",
    )
    launcher.start(timeout_s=90)
    try:
        yield launcher
    finally:
        launcher.stop()


def owner_of(launcher: Launcher, key: str) -> str:
    """The component name of the primary that holds `key`'s slot."""
    slot = key_slot(key.encode())
    port = launcher.mesh.by_name("redis").port
    with Redis(port=port, password=launcher.secrets.redis_password) as r:
        for start, end, primary, *_ in r.execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                owner = int(primary[1])
    return next(c.name for c in launcher.mesh.components if c.kind == "redis" and c.port == owner)


class ConnectStorm:
    """Persistent-session CONNECT + DISCONNECT in a loop over `clients` ids and both nodes:
    when each CONNECT was accepted, refused or not answered."""

    def __init__(self, ports: list[int], clients: int = 20) -> None:
        self._ports = ports
        self._ids = [f"storm-{i}" for i in range(clients)]
        self.accepted: list[float] = []
        self.failed: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            client_id, port = self._ids[n % len(self._ids)], self._ports[n % 2]
            n += 1
            (self.accepted if self._one(client_id, port) else self.failed).append(time.monotonic())

    @staticmethod
    def _one(client_id: str, port: int) -> bool:
        try:
            raw = Raw(port, level=4)
            try:
                ack = raw.connect(Connect(client_id, protocol_level=4, clean_start=False))
                ok = isinstance(ack, ConnAck) and ack.reason_code == 0
                if ok:
                    raw.send(Disconnect())
                return ok
            finally:
                raw.sock.close()
        except (OSError, TimeoutError, ConnectionError):
            return False


def held_connection(port: int, client_id: str) -> Raw:
    """A persistent 3.1.1 connection without keep alive (it stays until the server closes
    it; a paho client would reconnect by itself and take the session back)."""
    raw = Raw(port, level=4)
    ack = raw.connect(Connect(client_id, protocol_level=4, clean_start=False, keepalive_s=0))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def test_mesh_serves_on_a_redis_cluster(cluster_mesh: Launcher) -> None:
    """Persistent sessions connect, subscribe and get QoS 1 across the two nodes, and a
    CONNECT for a client id on the other node takes the session over."""
    ports = node_ports(cluster_mesh)()
    sub = Paho(ports[1], client_id="cluster-sub")
    sub.connect(clean_start=False, session_expiry=600)
    sub.subscribe("cl/#", qos=1)
    pub = Paho(ports[0])
    pub.connect()
    pub.c.publish("cl/x", b"hello", qos=1).wait_for_publish(10)
    assert sub.messages.get(timeout=10).payload == b"hello"
    moved = Paho(ports[0], client_id="cluster-sub")
    moved.connect(clean_start=False, session_expiry=600)
    assert moved.session_present
    wait_until(lambda: not sub.c.is_connected(), 10, "the old connection was taken over")
    for c in (pub, moved, sub):
        c.c.loop_stop()
        c.c.disconnect()


def test_a_killed_primary_under_a_connect_storm(cluster_mesh: Launcher, tmp_path: Path) -> None:
    launcher = cluster_mesh
    victim = owner_of(launcher, "{default}")
    ports = node_ports(launcher)()
    firsts = [held_connection(ports[0], f"dup-{i}") for i in range(DUPLICATE_PAIRS)]
    storm = ConnectStorm(ports)
    figures: dict[str, float] = {}
    seconds: list[Raw] = []

    def inject(load: Load) -> None:
        storm.start()
        wait_until(lambda: len(storm.accepted) >= 20, 30, "the storm before the fault")
        killed = time.monotonic()
        launcher.kill(victim)
        time.sleep(DOWN_S)
        restarted = time.monotonic()
        launcher.restart(victim)
        # CONNECTs resume: a storm CONNECT accepted after the restart.
        wait_until(lambda: storm.accepted[-1] > restarted, 60, "CONNECTs after the restart")
        back = next(t for t in storm.accepted if t > restarted)
        failures = [t for t in storm.failed if t >= killed]
        figures.update(
            connects_failed=len(failures),
            connect_gap_s=round(back - killed, 2),
            after_restart_s=round(back - restarted, 2),
        )
        # The same client ids again, on the other node, after the loss.
        seconds.extend(held_connection(ports[1], f"dup-{i}") for i in range(DUPLICATE_PAIRS))
        storm.stop()

    try:
        run_under_load(
            launcher,
            "redis_cluster_primary_killed",
            f"{victim} SIGKILLed under load",
            inject,
            figures=figures,
        )
    finally:
        storm.stop()
    print(f"\nredis cluster primary {victim} down {DOWN_S} s: {figures}")
    # No duplicate live session: each earlier connection was closed (taken over, or kicked
    # when its node re-asserted it), each later one stays.
    assert all(c.closed(20) for c in firsts), "a client id connected on both nodes"
    assert not any(c.closed(0.5) for c in seconds), "a later connection was dropped"
    for c in [*firsts, *seconds]:
        c.sock.close()
