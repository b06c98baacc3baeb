"""Kills with an exact script (no load): the DUP flag after the session's node dies
mid-delivery, the expiry of a session whose node died, and a delayed publish that outlives a
restart of every service. They run on the fault suite's mesh (`fault_mesh`, conftest.py);
losses under load are tests/faults/test_under_load.py.
"""

from __future__ import annotations

import itertools
import json
import threading
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

        def resumed() -> tuple[Raw, ConnAck] | None:
            back, ack = _persistent(port(fault_mesh, 0), cid)
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
    wait_until(  # node timeout 3 s + expiry 2 s + sweeps
        lambda: not _rows(fault_mesh, "queues.db", queued, f"{cid}#%"),
        30,
        "the dead node's session expired",
        every_s=0.2,
    )
    assert (
        _rows(fault_mesh, "sessions.db", "SELECT count(*) FROM sessions WHERE client_id=?", cid)
        == 0
    )
    raw.close()
    fault_mesh.restart("connection-1")


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


def test_a_dead_nodes_subscriptions_leave_the_tenant_count(fault_mesh: Launcher) -> None:
    """`max_tenant_subscriptions` 3, all held by clients of node 1, which is SIGKILLed: once
    the session service declares it dead (node timeout 3 s here) its figure leaves the
    tenant's count, and a client on node 0 gets the slots back."""
    import asyncio

    from services.quota.client import Limits, QuotaAdminClient

    tenant = f"k{uuid.uuid4().hex[:8]}"

    async def limit() -> None:
        c = QuotaAdminClient(
            f"127.0.0.1:{fault_mesh.mesh.by_name('quota').grpc_port}", fault_mesh.admin_token
        )
        try:
            await c.set_limits(tenant, Limits(max_tenant_subscriptions=3))
        finally:
            await c.close()

    asyncio.run(limit())

    def client(node: int) -> Raw:
        raw = Raw(port(fault_mesh, node))
        ack = raw.connect(Connect(f"c-{uuid.uuid4().hex[:8]}", 5, username=f"{tenant}/dev"))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        return raw

    def sub(raw: Raw, pid: int, topic: str) -> int:
        raw.send(Subscribe(pid, (Subscription(topic, 1),)))
        ack = raw.recv()
        assert isinstance(ack, SubAck), ack
        return ack.reason_codes[0]

    doomed = client(1)
    assert [sub(doomed, i + 1, f"d/{i}") for i in range(3)] == [1, 1, 1]
    survivor = client(0)
    assert sub(survivor, 1, "s/0") == 0x97
    fault_mesh.kill("connection-1")
    try:
        pids = itertools.count(2)
        wait_until(
            lambda: sub(survivor, next(pids), "s/0") == 1,
            15,
            "the dead node's subscriptions no longer counted",
            every_s=0.3,
        )
        assert [sub(survivor, 50 + i, f"s/{i}") for i in (1, 2, 3)] == [1, 1, 0x97]
    finally:
        survivor.close()
        doomed.close()
        fault_mesh.restart("connection-1")


def test_wills_of_a_killed_nodes_clients_are_published(fault_mesh: Launcher) -> None:
    """Node 1 is SIGKILLed with six clients on it; a subscriber on node 0 gets the wills
    MQTT says are due: the dead node's clients' once the session service declares it dead
    (3 s here), one with a 6 s Will Delay Interval after what is left of it, those of clients
    whose takeover finds the node gone and whose will is due (delay 0; a clean start ends
    the session whatever the delay), and neither the will of a client back within its delay
    nor that of one that sent DISCONNECT. A rule on the wills' topics sees the same ones (its
    republished copies)."""
    import asyncio

    from services.common.mqtt import Disconnect, Will
    from services.rules.admin_client import RulesAdminClient
    from services.session.client import SessionAdminClient

    topic = f"wills/{uuid.uuid4().hex[:6]}"
    got: list[tuple[bytes, float]] = []
    ruled: list[bytes] = []

    def on_message(cl: object, u: object, m: mqtt.MQTTMessage) -> None:
        if m.topic.startswith("ruled/"):  # the rule's row (SELECT *) as JSON
            ruled.append(json.loads(m.payload)["payload"].encode())
        else:
            got.append((m.payload, time.monotonic()))

    rules_addr = f"127.0.0.1:{fault_mesh.mesh.by_name('rules').grpc_port}"
    rule_id = f"wills-{topic[6:]}"

    async def rule(create: bool) -> None:
        admin = RulesAdminClient(rules_addr, fault_mesh.admin_token)
        try:
            if create:
                await admin.create(
                    "default",
                    rule_id,
                    f'SELECT * FROM "{topic}/#"',
                    [("republish", {"topic": f"ruled/{topic[6:]}/${{clientid}}", "qos": "1"})],
                )
            else:
                await admin.delete("default", rule_id)
        finally:
            await admin.close()

    asyncio.run(rule(create=True))
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    sub.on_message = on_message
    subacked = threading.Event()
    sub.on_subscribe = lambda *_: subacked.set()
    sub.connect("127.0.0.1", port(fault_mesh, 0))
    sub.loop_start()
    sub.subscribe([(f"{topic}/#", 1), (f"ruled/{topic[6:]}/#", 1)])

    def client(name: str, node: int, v5: bool, delay: int = 0, clean: bool = True) -> Raw:
        raw = Raw(port(fault_mesh, node))
        props = Properties(session_expiry_interval=60) if v5 and delay else Properties()
        will = Will(
            f"{topic}/{name}",
            f"{name} gone".encode(),
            1,
            properties=Properties(will_delay_interval=delay) if delay else Properties(),
        )
        ack = raw.connect(
            Connect(
                f"w-{name}-{topic[6:]}",
                5 if v5 else 4,
                clean_start=clean,
                will=will,
                properties=props,
            )
        )
        assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
        return raw

    async def registered(client_id: str) -> bool:
        admin = SessionAdminClient(
            f"127.0.0.1:{fault_mesh.mesh.by_name('session').grpc_port}", fault_mesh.admin_token
        )
        try:
            return any(c.client_id == client_id for c in await admin.list_clients("default"))
        finally:
            await admin.close()

    try:
        # The SUBSCRIBE goes out with the connection; paho does not wait for the SUBACK.
        wait_until(subacked.is_set, 10, "the SUBACK")
        held = {
            "plain": client("plain", 1, v5=False),  # 3.1.1, will at QoS 1
            "delayed": client("delayed", 1, v5=True, delay=6, clean=False),
            "back": client("back", 1, v5=True, delay=30, clean=False),
            "restart": client("restart", 1, v5=True, delay=30, clean=False),
            "takeover": client("takeover", 1, v5=True),
            "polite": client("polite", 1, v5=True),
        }
        held["polite"].send(Disconnect())
        assert held["polite"].closed()
        wait_until(  # its release is done
            lambda: not asyncio.run(registered(f"w-polite-{topic[6:]}")),
            10,
            "the polite client's release",
        )
        fault_mesh.kill("connection-1")
        killed = time.monotonic()
        # Back on node 0 at once: within its 30 s delay (session resumed: no will), with a
        # clean start (the old session ends: its will is due), and with delay 0.
        back = client("back", 0, v5=True, delay=30, clean=False)
        restart = client("restart", 0, v5=True, delay=30, clean=True)
        again = client("takeover", 0, v5=True)
        want = {b"plain gone", b"delayed gone", b"takeover gone", b"restart gone"}
        wait_until(lambda: want <= {p for p, _ in got}, 25, lambda: f"the wills; published: {got}")
        wait_until(lambda: want <= set(ruled), 10, lambda: f"the wills; the rule saw: {ruled}")
        # Must not happen: a will that should not come would come within this window.
        extra = holds_within(lambda: len(got) > len(want) or len(ruled) > len(want), 1.5)
        assert not extra, f"wills that should not come: {got}, {ruled}"
        assert sorted(p for p, _ in got) == sorted(want)
        assert sorted(ruled) == sorted(want)
        at = {p: t - killed for p, t in got}
        # The delayed one waited for its delay, counted from the node's death.
        assert at[b"delayed gone"] >= 5.0, at
        for raw in (back, restart, again):
            raw.send(Disconnect())
    finally:
        sub.disconnect()
        sub.loop_stop()
        asyncio.run(rule(create=False))
        fault_mesh.restart("connection-1")
