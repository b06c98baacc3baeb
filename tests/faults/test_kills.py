"""Kills with an exact script (no load): the DUP flag after the session's node dies
mid-delivery, the expiry of a session whose node died, and a delayed publish that outlives a
restart of every service. They run on the fault suite's mesh (`fault_mesh`, conftest.py);
losses under load are tests/faults/test_under_load.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import paho.mqtt.client as mqtt

from services.cli.launcher import Launcher
from services.common.mqtt import ConnAck, Connect, PubAck, Publish, SubAck, Subscribe, Subscription
from services.common.mqtt.properties import Properties
from tests.e2e.clients import Raw
from tests.poll import holds_within, wait_until


def port(launcher: Launcher, i: int) -> int:
    return launcher.mesh.by_name(f"connection-{i}").port


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


def _publish_acknowledged(port: int, topic: str, total: int) -> None:
    """`total` QoS 1 publishes of their numbers, each acknowledged (so each must arrive)."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port)
    c.loop_start()
    infos = [c.publish(topic, str(i), 1) for i in range(total)]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()  # acknowledged: it must reach the subscriber
    c.disconnect()
    c.loop_stop()


def _resumed_delivery(port: int, cid: str, total: int) -> dict[int, Publish]:
    """Resume `cid` on the node at `port` and acknowledge what comes until 10..total-1 did."""

    def resumed() -> tuple[Raw, ConnAck] | None:
        back, ack = _persistent(port, cid)
        if ack.reason_code == 0:
            return back, ack
        back.close()
        return None

    # Until the session service lets the session move to node 0.
    back, ack = wait_until(resumed, 30, "a resume on node 0", every_s=0.2)
    assert ack.session_present
    second: dict[int, Publish] = {}
    while not set(range(10, total)) <= second.keys():  # resent in seq order
        p = back.recv()
        assert isinstance(p, Publish), p
        assert int(p.payload) not in second, f"{p.payload!r} twice on one connection"
        second[int(p.payload)] = p
        back.send(PubAck(p.packet_id or 0))
    back.close()
    return second


def test_dup_after_the_session_node_is_killed_mid_delivery(fault_mesh: Launcher) -> None:
    """The subscriber's node dies with 20 messages sent and not acknowledged: on another node
    everything published arrives, whatever was sent comes back with DUP=1 under its packet
    id, and what no connection was handed comes with DUP=0."""
    total = 200
    cid, topic = f"k-{uuid.uuid4().hex[:8]}", f"kdup/{uuid.uuid4().hex[:6]}"
    raw, _ = _persistent(port(fault_mesh, 1), cid)
    raw.send(Subscribe(1, (Subscription(topic, 1),)))
    assert isinstance(raw.recv(), SubAck)
    _publish_acknowledged(port(fault_mesh, 0), topic, total)
    first = _publishes(raw, 20)  # the client's Receive Maximum
    for p in first[:10]:
        raw.send(PubAck(p.packet_id or 0))
    first += _publishes(raw, 10)  # the window refilled: 10 more, none acknowledged
    assert [(int(p.payload), p.dup) for p in first] == [(i, False) for i in range(30)]
    fault_mesh.kill("connection-1")
    raw.close()
    try:
        second = _resumed_delivery(port(fault_mesh, 0), cid, total)
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
    try:
        _expires_with_its_node_dead(fault_mesh, cid, topic)
    finally:
        raw.close()
        fault_mesh.restart("connection-1")


def _expires_with_its_node_dead(launcher: Launcher, cid: str, topic: str) -> None:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port(launcher, 0))
    c.loop_start()
    for i in range(3):
        c.publish(topic, str(i), 1).wait_for_publish(10)
    c.disconnect()
    c.loop_stop()
    queued = "SELECT count(*) FROM queue_entries WHERE queue_id LIKE ?"
    assert _rows(launcher, "queues.db", queued, f"{cid}#%") == 3
    stored = "SELECT count(*) FROM sessions WHERE client_id=?"
    # Node timeout 3 s + expiry 2 s + sweeps; the queue goes first, then the record.
    wait_until(
        lambda: (
            not _rows(launcher, "queues.db", queued, f"{cid}#%")
            and not _rows(launcher, "sessions.db", stored, cid)
        ),
        30,
        lambda: (
            "the dead node's session expired: queued "
            f"{_rows(launcher, 'queues.db', queued, f'{cid}#%')}, "
            f"records {_rows(launcher, 'sessions.db', stored, cid)}"
        ),
        every_s=0.2,
    )


def test_delayed_publish_survives_a_restart_of_every_service(fault_mesh: Launcher) -> None:
    topic = f"delay/{uuid.uuid4().hex[:6]}"
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port(fault_mesh, 0))
    c.loop_start()
    sent = time.monotonic()
    c.publish(f"$delayed/20/{topic}", "survivor", 1).wait_for_publish(10)
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
    assert time.monotonic() - sent < 19, "restarts took too long for this test's delay"
    holds_within(lambda: got, sent + 25 - time.monotonic())  # the asserts below say what came
    sub.disconnect()
    sub.loop_stop()
    assert [p for p, _ in got] == [b"survivor"]
    assert 20.0 <= got[0][1] <= 21.5  # within a second of its due time


async def _limit_tenant_subscriptions(launcher: Launcher, tenant: str, limit: int) -> None:
    from services.quota.client import Limits, QuotaAdminClient

    address = f"127.0.0.1:{launcher.mesh.by_name('quota').grpc_port}"
    c = QuotaAdminClient(address, launcher.admin_token)
    try:
        await c.set_limits(tenant, Limits(max_tenant_subscriptions=limit))
    finally:
        await c.close()


def _subscribe(raw: Raw, pid: int, topic: str) -> int:
    """SUBSCRIBE to one filter at QoS 1; the SUBACK's reason code."""
    raw.send(Subscribe(pid, (Subscription(topic, 1),)))
    ack = raw.recv()
    assert isinstance(ack, SubAck), ack
    return ack.reason_codes[0]


def test_a_dead_nodes_subscriptions_leave_the_tenant_count(fault_mesh: Launcher) -> None:
    """`max_tenant_subscriptions` 3, all held by clients of node 1, which is SIGKILLed: once
    the session service declares it dead (node timeout 3 s here) its figure leaves the
    tenant's count, and a client on node 0 gets the slots back."""
    tenant = f"k{uuid.uuid4().hex[:8]}"
    asyncio.run(_limit_tenant_subscriptions(fault_mesh, tenant, 3))

    def client(node: int) -> Raw:
        raw = Raw(port(fault_mesh, node))
        ack = raw.connect(Connect(f"c-{uuid.uuid4().hex[:8]}", 5, username=f"{tenant}/dev"))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        return raw

    doomed = client(1)
    assert [_subscribe(doomed, i + 1, f"d/{i}") for i in range(3)] == [1, 1, 1]
    survivor = client(0)
    assert _subscribe(survivor, 1, "s/0") == 0x97
    fault_mesh.kill("connection-1")
    try:
        pids = itertools.count(2)
        wait_until(
            lambda: _subscribe(survivor, next(pids), "s/0") == 1,
            15,
            "the dead node's subscriptions no longer counted",
            every_s=0.3,
        )
        assert [_subscribe(survivor, 50 + i, f"s/{i}") for i in (1, 2, 3)] == [1, 1, 0x97]
    finally:
        survivor.close()
        doomed.close()
        fault_mesh.restart("connection-1")
