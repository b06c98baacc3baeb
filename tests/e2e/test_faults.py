"""Nothing acknowledged is lost: 10,000 QoS 1 messages to a persistent subscriber while the
subscriber's node, the router or the queue service is SIGKILLed mid-stream.

These tests kill processes, so they run on a mesh of their own (two nodes), not the shared
one. The subscriber is a raw-socket client that acknowledges everything it receives and
reconnects (clean start 0) wherever it is told to.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest

from services.cli.launcher import Launcher
from services.common.mqtt import ConnAck, Connect, PubAck, Publish, SubAck, Subscribe, Subscription
from services.common.mqtt.properties import Properties
from tests.e2e.clients import Raw

N = 10_000


@pytest.fixture(scope="module")
def fault_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(
        tmp_path_factory.mktemp("faults") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={"STARLING_LOG_LEVEL": "INFO", "STARLING_NODE_TIMEOUT_S": "3"},
    )
    launcher.start(timeout_s=60)
    yield launcher
    launcher.stop()


def port(launcher: Launcher, i: int) -> int:
    return launcher.mesh.by_name(f"connection-{i}").port


class Reader(threading.Thread):
    """Persistent subscriber: acks everything, records (value, dup), reconnects on loss."""

    def __init__(self, port: int, cid: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.cid = cid
        self.topic = topic
        self.got: list[tuple[int, bool]] = []
        self.pids: list[int] = []
        self.unique: set[int] = set()
        self.stop = False
        self.connections = 0
        self.ready = threading.Event()

    def run(self) -> None:
        while not self.stop and len(self.unique) < N:
            try:
                self._session()
            except (OSError, ConnectionError, TimeoutError):
                time.sleep(0.2)

    def _session(self) -> None:
        raw = Raw(self.port)
        try:
            ack = raw.connect(
                Connect(
                    self.cid,
                    5,
                    clean_start=False,
                    keepalive_s=30,
                    properties=Properties(session_expiry_interval=600, receive_maximum=200),
                )
            )
            assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
            self.connections += 1
            if self.connections == 1:
                raw.send(Subscribe(1, (Subscription(self.topic, 1),)))
            while not self.stop and len(self.unique) < N:
                p = raw.recv(timeout=2)
                if isinstance(p, SubAck):
                    self.ready.set()
                elif isinstance(p, Publish):
                    v = int(p.payload)
                    self.got.append((v, p.dup))
                    self.pids.append(p.packet_id or 0)
                    self.unique.add(v)
                    raw.send(PubAck(p.packet_id or 0))
        finally:
            raw.close()


def publish_all(port: int, topic: str, on_progress: object = None) -> list[object]:
    """Queue N QoS 1 publishes in paho (it keeps 200 in flight); returns their infos."""
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"pub-{uuid.uuid4().hex[:6]}",
        protocol=mqtt.MQTTv311,
    )
    c.max_inflight_messages_set(200)
    publish_all.connects = 0  # type: ignore[attr-defined]

    def on_connect(*_: object) -> None:
        publish_all.connects += 1  # type: ignore[attr-defined]

    def on_disconnect(client: object, u: object, f: object, rc: object, p: object) -> None:
        publish_all.disconnects.append(str(rc))  # type: ignore[attr-defined]

    publish_all.disconnects = []  # type: ignore[attr-defined]
    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port, keepalive=60)
    c.loop_start()
    infos = []
    for i in range(N):
        infos.append(c.publish(topic, str(i), 1))
        if on_progress is not None:
            on_progress(i)  # type: ignore[operator]
    publish_all.client = c  # type: ignore[attr-defined]
    return infos


def check_all_in_order(reader: Reader) -> None:
    seen: set[int] = set()
    firsts = []
    for k, (v, dup) in enumerate(reader.got):
        if v in seen:
            assert dup, (
                f"message {v} repeated without DUP: {reader.got[max(0, k - 5) : k + 3]} "
                f"pids {reader.pids[max(0, k - 5) : k + 3]} publisher connects "
                f"{publish_all.connects} {publish_all.disconnects}"
            )  # type: ignore[attr-defined]
        else:
            seen.add(v)
            firsts.append(v)
    assert firsts == list(range(N)), "first deliveries out of publish order or missing"


def _run(launcher: Launcher, victim: str, sub_node: int, resume_node: int, restart: bool) -> Reader:
    cid, topic = f"f-{uuid.uuid4().hex[:8]}", f"fault/{uuid.uuid4().hex[:6]}"
    reader = Reader(port(launcher, sub_node), cid, topic)
    reader.start()
    assert reader.ready.wait(20), "subscriber not subscribed"
    killed = threading.Event()

    def on_progress(i: int) -> None:
        if i == N // 3 and not killed.is_set():
            # Let a third of the stream flow, then kill mid-stream.
            deadline = time.monotonic() + 30
            while len(reader.unique) < N // 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            launcher.kill(victim)
            killed.set()
            reader.port = port(launcher, resume_node)

    infos = publish_all(port(launcher, 0), topic, on_progress)
    if restart:
        time.sleep(1.0)  # down for a second, with publishes waiting for their acks
        launcher.restart(victim)  # from this (long-lived) thread: see Launcher.restart
    for info in infos:
        info.wait_for_publish(60)  # type: ignore[attr-defined]
        assert info.is_published()  # type: ignore[attr-defined]
    publish_all.client.disconnect()  # type: ignore[attr-defined]
    publish_all.client.loop_stop()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 90
    while len(reader.unique) < N and time.monotonic() < deadline:
        time.sleep(0.1)
    reader.stop = True
    reader.join(10)
    assert killed.is_set()
    check_all_in_order(reader)
    return reader


def test_subscriber_node_killed(fault_mesh: Launcher) -> None:
    reader = _run(fault_mesh, "connection-1", sub_node=1, resume_node=0, restart=False)
    assert reader.connections >= 2  # it really lost its node and resumed elsewhere
    fault_mesh.restart("connection-1")


def test_router_killed_and_restarted(fault_mesh: Launcher) -> None:
    _run(fault_mesh, "router", sub_node=1, resume_node=1, restart=True)


def test_queue_service_killed_and_restarted(fault_mesh: Launcher) -> None:
    _run(fault_mesh, "queue", sub_node=1, resume_node=1, restart=True)


def _persistent(port: int, cid: str) -> tuple[Raw, ConnAck]:
    """A raw MQTT 5 connection resuming `cid` (at most 20 messages in flight to it)."""
    raw = Raw(port)
    ack = raw.connect(
        Connect(
            cid,
            5,
            clean_start=False,
            properties=Properties(session_expiry_interval=600, receive_maximum=20),
        )
    )
    assert isinstance(ack, ConnAck), ack
    return raw, ack


def _publishes(raw: Raw, n: int) -> list[Publish]:
    got = []
    while len(got) < n:
        p = raw.recv()
        assert isinstance(p, Publish), p
        got.append(p)
    return got


def test_dup_after_the_session_node_is_killed_mid_delivery(fault_mesh: Launcher) -> None:
    """The subscriber's node dies with 20 messages sent and not acknowledged: on another node
    everything published arrives, whatever was sent comes back with DUP=1 under its packet
    id, and what no connection was handed comes with DUP=0."""
    total = 200
    cid, topic = f"k-{uuid.uuid4().hex[:8]}", f"kdup/{uuid.uuid4().hex[:6]}"
    raw, _ = _persistent(port(fault_mesh, 1), cid)
    raw.send(Subscribe(1, (Subscription(topic, 1),)))
    assert isinstance(raw.recv(), SubAck)
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port(fault_mesh, 0))
    c.loop_start()
    infos = [c.publish(topic, str(i), 1) for i in range(total)]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()  # acknowledged: it must reach the subscriber
    c.disconnect()
    c.loop_stop()
    first = _publishes(raw, 20)  # the client's Receive Maximum
    for p in first[:10]:
        raw.send(PubAck(p.packet_id or 0))
    first += _publishes(raw, 10)  # the window refilled: 10 more, none acknowledged
    assert [(int(p.payload), p.dup) for p in first] == [(i, False) for i in range(30)]
    fault_mesh.kill("connection-1")
    raw.close()
    try:
        deadline = time.monotonic() + 30
        while True:  # until the session service lets the session move to node 0
            back, ack = _persistent(port(fault_mesh, 0), cid)
            if ack.reason_code == 0:
                break
            back.close()
            assert time.monotonic() < deadline, f"no resume on node 0: {ack}"
            time.sleep(0.2)
        assert ack.session_present
        second: dict[int, Publish] = {}
        while not set(range(10, total)) <= second.keys():  # resent in seq order
            p = back.recv()
            assert isinstance(p, Publish), p
            assert int(p.payload) not in second, f"{p.payload!r} twice on one connection"
            second[int(p.payload)] = p
            back.send(PubAck(p.packet_id or 0))
        back.close()
    finally:
        fault_mesh.restart("connection-1")
    sent = {int(p.payload): p for p in first}
    # Nothing acknowledged is lost: every publish reached the client.
    assert sent.keys() | second.keys() == set(range(total))
    # Everything the dead node sent and is sent again carries DUP=1 and its packet id (0..9
    # come back only if their PUBACKs had not yet reached the queue).
    for v, p in second.items():
        if v in sent:
            assert p.dup and p.packet_id == sent[v].packet_id, (v, p)
    # What no connection was ever handed is a first attempt.
    assert [v for v, p in second.items() if v >= 30 and p.dup] == []


def _rows(launcher: Launcher, db: str, sql: str, arg: str) -> int:
    import sqlite3
    from pathlib import Path

    path = Path(launcher.mesh.data_dir) / "data" / db
    with sqlite3.connect(path) as conn:
        return int(conn.execute(sql, (arg,)).fetchone()[0])


def test_session_of_a_dead_node_still_expires(fault_mesh: Launcher) -> None:
    """The client's node is SIGKILLed and the client never returns: the session service
    notices the silent node, starts the expiry clock, and removes session and queue."""
    cid, topic = f"gone-{uuid.uuid4().hex[:8]}", f"gone/{uuid.uuid4().hex[:6]}"
    raw = Raw(port(fault_mesh, 1))
    raw.connect(
        Connect(cid, 5, clean_start=False, properties=Properties(session_expiry_interval=2))
    )
    raw.send(Subscribe(1, (Subscription(topic, 1),)))
    assert isinstance(raw.recv(), SubAck)
    fault_mesh.kill("connection-1")
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port(fault_mesh, 0))
    c.loop_start()
    for i in range(3):
        c.publish(topic, str(i), 1).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()
    queued = "SELECT count(*) FROM queue_entries WHERE queue_id LIKE ?"
    assert _rows(fault_mesh, "queues.db", queued, f"{cid}#%") == 3
    deadline = time.monotonic() + 30  # node timeout 3 s + expiry 2 s + sweeps
    while _rows(fault_mesh, "queues.db", queued, f"{cid}#%"):
        assert time.monotonic() < deadline, "the dead node's session never expired"
        time.sleep(0.2)
    assert (
        _rows(fault_mesh, "sessions.db", "SELECT count(*) FROM sessions WHERE client_id=?", cid)
        == 0
    )
    raw.close()
    fault_mesh.restart("connection-1")


def test_delayed_publish_survives_a_restart_of_every_service(fault_mesh: Launcher) -> None:
    # Eight processes start one after another inside the delay: 2 s each on a busy 2-core
    # machine.
    DELAY_S = 20
    topic = f"delay/{uuid.uuid4().hex[:6]}"
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port(fault_mesh, 0))
    c.loop_start()
    sent = time.monotonic()
    c.publish(f"$delayed/{DELAY_S}/{topic}", "survivor", 1).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()
    for name in ("router", "queue", "session", "rules", "quota", "metrics"):
        fault_mesh.restart(name)
    for name in ("connection-0", "connection-1"):
        fault_mesh.restart(name)
    got: list[tuple[bytes, float]] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    sub.on_message = lambda cl, u, m: got.append((m.payload, time.monotonic() - sent))
    sub.connect("127.0.0.1", port(fault_mesh, 1))
    sub.loop_start()
    sub.subscribe(topic, 1)
    assert time.monotonic() - sent < DELAY_S - 1, "restarts took too long for this test's delay"
    deadline = sent + DELAY_S + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    sub.disconnect()
    sub.loop_stop()
    assert [p for p, _ in got] == [b"survivor"]
    assert DELAY_S <= got[0][1] <= DELAY_S + 1.5  # within a second of its due time
