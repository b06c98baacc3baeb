"""Several instances of the router, the queue, the session and the metrics service (issue 18):
two of each (as `starling up --routers 2 --queues 2 --sessions 2` starts them, metrics too),
one router, queue and session instance SIGKILLed in turn while at least 20,000 QoS 1 and
QoS 2 messages flow to persistent sessions on two nodes. Nothing acknowledged is lost, each
persistent session gets every publisher's messages in order, and every publisher's messages
are acknowledged again soon after each kill (the figure is recorded). With two session
instances a flapping client is banned at the same count as with one; with two metrics
instances usage and the cluster endpoint count each message once.

The nodes keep no copies of the route tables here (`route_copy_max_subscriptions` 0), so
every QoS>=1 publish goes through a router: a kill hits the publish path itself.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.cli.launcher import Launcher
from services.cli.status import run_status
from tests.faults.harness import MAX_PACKET, Load, resume_s, run_under_load
from tests.poll import holds_within, wait_until

pytestmark = pytest.mark.timeout(240)
# Every publisher's messages acknowledged again within this after a kill: a routed batch
# that a killed router held is sent again after services/router/client.py's FAIL_OVER_S; a
# killed queue instance's partitions move after one lease (queue_lease_ttl_ms, 1.2 s).
RESUME_S = 2.0
MESSAGES = 20_000  # sent in all, across the kills
RATE = 400.0  # per publisher (three of them): 20,000 messages in about 17 s of load
KILLED = ("router", "queue", "session")


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(
        data_dir=tmp_path_factory.mktemp("scaled") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
            "STARLING_ROUTE_COPY_MAX_SUBSCRIPTIONS": "0",
            "STARLING_STATS_INTERVAL_S": "0.5",  # reports reach the metrics instances often
            "STARLING_FLAPPING_ENABLED": "true",  # tested below; off in the default profile
        },
        instances={"router": 2, "queue": 2, "session": 2, "metrics": 2},
    )
    launcher.start(timeout_s=90)
    try:
        yield launcher
    finally:
        launcher.stop()


def test_status_shows_every_instance(scaled: Launcher, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_status(Path(scaled.mesh.data_dir)) == 0
    shown = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    for name in ("router", "router-1", "session", "session-1", "queue", "queue-1"):
        assert shown[name] == "SERVING", shown
    # Each instance knows its ordinal and the count (settings instance_index/_count).
    env = scaled._specs["router-1"][1] or {}
    assert (env["STARLING_INSTANCE_INDEX"], env["STARLING_INSTANCE_COUNT"]) == ("1", "2")
    assert env["STARLING_ROUTER_ADDR"].count(",") == 1


def test_sigkill_a_router_a_queue_and_a_session_instance_under_load(scaled: Launcher) -> None:
    figures: dict[str, float] = {}

    def inject(load: Load) -> None:
        for name in KILLED:
            killed = time.monotonic()
            scaled.kill(name)
            figures[name] = round(resume_s(load, killed), 2)
            time.sleep(1.0)  # load with one instance down, then it joins again
            scaled.restart(name)
            time.sleep(1.0)

    verdict = run_under_load(
        scaled,
        "router x2, queue x2, session x2: SIGKILL one of each in turn",
        "router, queue and session instance 0 SIGKILLed in turn (each restarted after)",
        inject,
        moving_qos=1,
        rate=RATE,
        min_sent=MESSAGES,
    )
    print(f"resumed within (s): {figures}")
    assert verdict.sent >= MESSAGES
    for name, seconds in figures.items():
        assert seconds < RESUME_S, f"publishing resumed {seconds} s after {name} was killed"


def _client(port: int, cid: str = "", clean: bool = True) -> mqtt.Client:
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311, clean_session=clean
    )
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _subscribe(c: mqtt.Client, topic: str) -> None:
    """SUBSCRIBE at QoS 1 and wait for the SUBACK."""
    acked = threading.Event()
    c.on_subscribe = lambda *a: acked.set()
    c.subscribe(topic, 1)
    assert acked.wait(10), f"no SUBACK for {topic}"


def test_every_router_sees_the_others_changes(scaled: Launcher) -> None:
    """With two routers answering in turn: a publish right after each new persistent
    subscription's SUBACK reaches it (route table), each subscriber gets the retained value
    the last acknowledged publish set (retained index), and delayed messages fire once."""
    base = f"sc/{uuid.uuid4().hex[:8]}"
    ports = [scaled.mesh.by_name(f"connection-{i}").port for i in range(2)]
    got: dict[str, list[bytes]] = {}
    pub = _client(ports[0])
    clean = _client(ports[1])
    got["clean"] = []
    clean.on_message = lambda c, u, m: got["clean"].append(m.payload)
    _subscribe(clean, f"{base}/t")
    subs = [clean]
    try:
        for i in range(8):  # SUBSCRIBEs and publishes spread over both routers
            name = f"p{i}"
            got[name] = []
            sub = _client(ports[i % 2], f"{base}-{name}".replace("/", "-"), clean=False)
            sub.on_message = lambda c, u, m, n=name: got[n].append(m.payload)
            _subscribe(sub, f"{base}/t")
            subs.append(sub)
            pub.publish(f"{base}/r", f"v{i}", 1, retain=True).wait_for_publish(10)
        # Each retained value acknowledged is what the next SUBSCRIBE sees, router by router.
        for i in range(4):
            seen: list[bytes] = []
            c = _client(ports[i % 2])
            c.on_message = lambda cl, u, m, s=seen: s.append(m.payload)
            _subscribe(c, f"{base}/r")
            assert holds_within(lambda s=seen: bool(s), 10), "no retained message"
            assert seen[0] == b"v7", seen
            c.disconnect()
            c.loop_stop()
        for i in range(10):
            pub.publish(f"$delayed/1/{base}/t", f"d{i}", 1).wait_for_publish(10)
        pub.publish(f"{base}/t", "direct", 1).wait_for_publish(10)
        want = sorted([b"direct"] + [f"d{i}".encode() for i in range(10)])
        assert holds_within(lambda: all(len(v) >= len(want) for v in got.values()), 20), got
        # A second firing (two schedulers) would reach the clean subscriber (persistent
        # queues drop a repeat by message id).
        assert not holds_within(lambda: len(got["clean"]) > len(want), 1.5), got["clean"]
        for name, payloads in got.items():
            assert sorted(payloads) == want, (name, payloads)
    finally:
        for c in [pub, *subs]:
            c.disconnect()
            c.loop_stop()


def test_a_flapping_client_is_caught_across_two_session_instances(scaled: Launcher) -> None:
    """The CONNECTs of one client id spread over both session instances (queue group) count
    together: the 16th within the window is refused (flapping_max_connects 15)."""
    ports = [scaled.mesh.by_name(f"connection-{i}").port for i in range(2)]
    cid = f"flappy-{uuid.uuid4().hex[:8]}"
    codes: list[int] = []
    for i in range(18):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv311)
        got = threading.Event()
        rc: list[int] = []
        c.on_connect = lambda cl, u, f, reason, p, rc=rc, got=got: (
            rc.append(reason.value),
            got.set(),
        )
        c.connect("127.0.0.1", ports[i % 2])
        c.loop_start()
        assert got.wait(10), "no CONNACK"
        c.disconnect()
        c.loop_stop()
        codes.append(rc[0])
        if rc[0]:
            break
    assert codes[:15] == [0] * 15 and codes[15] != 0, codes


def _messages_in(port: int) -> int:
    """Every tenant's messages in, from a metrics instance's cluster endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return int(
        sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "starling_cluster_messages_received_total"
        )
    )


def _usage_in(data_dir: Path) -> int:
    with sqlite3.connect(data_dir / "data" / "usage.db") as db:
        return int(db.execute("SELECT COALESCE(SUM(messages_in), 0) FROM usage").fetchone()[0])


def test_two_metrics_instances_count_each_message_once(scaled: Launcher) -> None:
    """Nodes' reports go to both metrics instances in turn: the usage table and either
    instance's cluster endpoint grow by exactly the messages clients published."""
    endpoints = [scaled.mesh.by_name(n).port for n in ("metrics", "metrics-1")]
    data_dir = Path(scaled.mesh.data_dir)

    def settled() -> tuple[int, ...]:
        """The figures once two reads 1.5 s apart (three report intervals) agree."""
        last: list[tuple[int, ...]] = [()]

        def agreed() -> tuple[int, ...]:
            now = (_usage_in(data_dir), *(_messages_in(p) for p in endpoints))
            same = now == last[0] and now[1] == now[2]
            last[0] = now
            return now if same else ()

        return wait_until(agreed, 60, lambda: f"the figures settled: {last[0]}", every_s=1.5)

    before = settled()
    port = scaled.mesh.by_name("connection-0").port
    pub = _client(port)
    try:
        for i in range(50):
            pub.publish(f"usage/{i}", b"x", 1).wait_for_publish(10)
    finally:
        pub.disconnect()
        pub.loop_stop()
    assert holds_within(lambda: _usage_in(data_dir) >= before[0] + 50, 15)
    after = settled()
    assert [a - b for a, b in zip(after, before, strict=True)] == [50, 50, 50]
