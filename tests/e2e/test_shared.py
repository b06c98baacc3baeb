"""Shared subscriptions across nodes: one member per message, credit-aware dispatch, and a
leaving member's unacknowledged messages redelivered to the others."""

from __future__ import annotations

import threading
import uuid

import paho.mqtt.client as mqtt
import pytest

from services.common.mqtt import Connect, Publish, SubAck, Subscribe, Subscription
from services.common.mqtt.properties import Properties
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho, Raw
from tests.poll import holds_within, wait_until

N = 3000


def _drops(mesh: MeshInfo) -> dict[str, int]:
    """Per-client drop counters of both nodes (for the failure message)."""
    import grpc

    from starling.connection.v1 import connection_pb2 as cpb
    from starling.connection.v1 import connection_pb2_grpc as cgrpc
    from tests.e2e.admin import MD

    out = {}
    for node in ("connection-0", "connection-1"):
        with grpc.insecure_channel(mesh.addr(node)) as ch:
            stats = (
                cgrpc.ConnectionAdminServiceStub(ch)
                .GetNodeStats(cpb.GetNodeStatsRequest(), metadata=MD)
                .stats
            )
        out.update({f"{node}/{c.client_id}": c.dropped for c in stats.client_drops})
    return out


class Leaver:
    """A member that takes messages but never acknowledges them, read in a thread; `leave`
    drops its connection mid-stream, with its messages unacknowledged."""

    def __init__(self, port: int, group: str, shared: str) -> None:
        self.raw = Raw(port)
        self.raw.connect(Connect(f"leaver-{group}", 5, properties=Properties(receive_maximum=20)))
        self.raw.send(Subscribe(1, (Subscription(shared, 1),)))
        assert isinstance(self.raw.recv(), SubAck)
        self.got: list[int] = []
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                p = self.raw.recv(timeout=0.2)
            except (TimeoutError, OSError, ConnectionError):
                continue
            if isinstance(p, Publish):
                self.got.append(int(p.payload))

    def leave(self) -> None:
        wait_until(lambda: self.got, 10, "a share for the leaving member", every_s=0.01)
        self.stop.set()
        self.reader.join(2)
        self.raw.close()  # mid-stream, with unacknowledged messages


def _publish_while_one_leaves(port: int, topic: str, leaver: Leaver) -> mqtt.Client:
    """N QoS 1 publishes, the leaver leaving halfway; returns once all are acknowledged."""
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    pub.max_inflight_messages_set(100)
    pub.max_queued_messages_set(0)
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    infos = []
    for i in range(N):
        infos.append(pub.publish(topic, str(i), 1))
        if i == N // 2:
            leaver.leave()
    for info in infos:
        info.wait_for_publish(30)
    return pub


def _taken(b: Paho, c: Paho) -> tuple[list[int], list[int]]:
    """What the remaining members got, once they got N between them (or it settled)."""
    got_b: list[int] = []
    got_c: list[int] = []

    def all_taken() -> bool:
        for client, got in ((b, got_b), (c, got_c)):
            while not client.messages.empty():
                got.append(int(client.messages.get().payload))
        return len(got_b) + len(got_c) >= N

    holds_within(all_taken, 30)  # settling: the asserts below name what is missing
    return got_b, got_c


def test_each_message_reaches_exactly_one_member_even_when_one_leaves(mesh: MeshInfo) -> None:
    group, topic = f"g{uuid.uuid4().hex[:6]}", f"jobs/{uuid.uuid4().hex[:6]}"
    shared = f"$share/{group}/{topic}"
    b = Paho(mesh.node(0))  # MQTT 5 member
    b.connect()
    b.subscribe(shared, 1)
    c = Paho(mesh.node(1), v5=False)  # MQTT 3.1.1 members may use shared subscriptions too
    c.connect()
    c.subscribe(shared, 1)
    a = Leaver(mesh.node(1), group, shared)
    pub = _publish_while_one_leaves(mesh.node(0), topic, a)
    got_b, got_c = _taken(b, c)
    got_a = a.got
    assert got_a, "the leaving member got no share before it left"
    assert got_b and got_c, "each remaining member gets a share"
    assert not set(got_b) & set(got_c), "a message reached two members"
    missing = sorted(set(range(N)) - set(got_b) - set(got_c))
    assert not missing, f"never acknowledged: {missing[:20]}..., drops: {_drops(mesh)}"
    assert sorted(got_b + got_c) == list(range(N)), "every message acknowledged exactly once"
    assert set(got_a) <= set(got_b) | set(got_c)  # the leaver's messages went on
    pub.disconnect()
    pub.loop_stop()
    b.close()
    c.close()


@pytest.mark.parametrize("qos", [1, 2])
def test_persistent_and_clean_members_share_the_stream(mesh: MeshInfo, qos: int) -> None:
    # QoS 2: a persistent member's PUBREL for a shared delivery (no entry of its queue) used
    # never to come, so it got nothing.
    group, topic = f"g{uuid.uuid4().hex[:6]}", f"work/{uuid.uuid4().hex[:6]}"
    shared = f"$share/{group}/{topic}"
    durable = Paho(mesh.node(0), client_id=f"dur-{group}")
    durable.connect(clean_start=False, session_expiry=60)
    durable.subscribe(shared, qos)
    clean = Paho(mesh.node(1))
    clean.connect()
    clean.subscribe(shared, qos)
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(200):
        pub.c.publish(topic, str(i), qos)
    pub.publish(topic, "200", qos)
    got: dict[str, list[int]] = {"durable": [], "clean": []}

    def all_taken() -> bool:
        for name, client in (("durable", durable), ("clean", clean)):
            while not client.messages.empty():
                got[name].append(int(client.messages.get().payload))
        return sum(map(len, got.values())) >= 201

    holds_within(all_taken, 20)  # settling: the asserts below compare what arrived
    assert got["durable"] and got["clean"]
    assert sorted(got["durable"] + got["clean"]) == list(range(201))
    for c in (durable, clean, pub):
        c.close()
