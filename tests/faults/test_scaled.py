"""Several instances of the router, the queue and the session service (issue 18): `starling
up --routers 2 --queues 2 --sessions 2`, one instance of each SIGKILLed in turn while at
least 20,000 QoS 1 and QoS 2 messages flow to persistent sessions on two nodes. Nothing
acknowledged is lost, each persistent session gets every publisher's messages in order, and
every publisher's messages are acknowledged again soon after each kill (the figure is
recorded).

The nodes keep no copies of the route tables here (`route_copy_max_subscriptions` 0), so
every QoS>=1 publish goes through a router: a kill hits the publish path itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from services.cli.launcher import Launcher
from services.cli.status import run_status
from tests.faults.harness import MAX_PACKET, Load, resume_s, run_under_load, wait_for

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
        tmp_path_factory.mktemp("scaled") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
            "STARLING_ROUTE_COPY_MAX_SUBSCRIPTIONS": "0",
        },
        instances={"router": 2, "queue": 2, "session": 2},
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
            assert wait_for(lambda s=seen: bool(s), 10), "no retained message"
            assert seen[0] == b"v7", seen
            c.disconnect()
            c.loop_stop()
        for i in range(10):
            pub.publish(f"$delayed/1/{base}/t", f"d{i}", 1).wait_for_publish(10)
        pub.publish(f"{base}/t", "direct", 1).wait_for_publish(10)
        want = sorted([b"direct"] + [f"d{i}".encode() for i in range(10)])
        assert wait_for(lambda: all(len(v) >= len(want) for v in got.values()), 20), got
        # A second firing (two schedulers) would reach the clean subscriber (persistent
        # queues drop a repeat by message id).
        assert not wait_for(lambda: len(got["clean"]) > len(want), 1.5), got["clean"]
        for name, payloads in got.items():
            assert sorted(payloads) == want, (name, payloads)
    finally:
        for c in [pub, *subs]:
            c.disconnect()
            c.loop_stop()
