"""Slow consumers: bounded queues, drops counted per tenant and per client."""

from __future__ import annotations

import socket

import grpc

from services.common.mqtt import Connect, PubAck, Publish, SubAck, Subscribe, Subscription
from services.common.mqtt.properties import Properties
from starling.connection.v1 import connection_pb2 as pb
from starling.connection.v1 import connection_pb2_grpc as pb_grpc
from tests.conftest import MeshInfo
from tests.e2e.admin import MD
from tests.e2e.clients import Paho, Raw
from tests.poll import wait_until


def _stats(mesh: MeshInfo, node: str) -> pb.NodeStats:
    with grpc.insecure_channel(mesh.addr(node)) as ch:
        return (
            pb_grpc.ConnectionAdminServiceStub(ch)
            .GetNodeStats(pb.GetNodeStatsRequest(), metadata=MD)
            .stats
        )


def _drops(mesh: MeshInfo, node: str, client_id: str) -> int:
    return sum(c.dropped for c in _stats(mesh, node).client_drops if c.client_id == client_id)


def test_qos1_queue_is_bounded_and_drops_are_counted(mesh: MeshInfo) -> None:
    # The mesh runs with max_queued_messages=100: 1 inflight + 100 queued, the rest dropped.
    raw = Raw(mesh.node(1))
    raw.connect(Connect("slow-q1", 5, properties=Properties(receive_maximum=1)))
    raw.send(Subscribe(1, (Subscription("slow/q1", 1),)))
    assert isinstance(raw.recv(), SubAck)
    pub = Paho(mesh.node(0))
    pub.connect()
    for i in range(150):
        pub.publish("slow/q1", str(i), 1)
    wait_until(lambda: _drops(mesh, "connection-1", "slow-q1") >= 49, 10, "49 drops counted")
    got = []
    while True:
        try:
            p = raw.recv(timeout=1)
        except TimeoutError:
            break
        assert isinstance(p, Publish)
        got.append(int(p.payload))
        raw.send(PubAck(p.packet_id or 0))
    assert got == list(range(101))  # the oldest kept, in order
    assert _drops(mesh, "connection-1", "slow-q1") == 49
    tenant = {t.tenant: t for t in _stats(mesh, "connection-1").tenants}["default"]
    assert tenant.messages_dropped >= 49
    pub.close()
    raw.close()


def test_qos0_dropped_when_the_socket_backs_up(mesh: MeshInfo) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", mesh.node(1)))
    raw = Raw.__new__(Raw)
    Raw.__init__(raw, mesh.node(1))
    raw.sock.close()
    raw.sock = sock
    raw.connect(Connect("slow-q0", 5))
    raw.send(Subscribe(1, (Subscription("slow/q0", 0),)))
    assert isinstance(raw.recv(), SubAck)
    pub = Paho(mesh.node(0))
    pub.connect()
    payload = b"x" * 60_000

    def dropped() -> bool:
        if _drops(mesh, "connection-1", "slow-q0"):
            return True
        for _ in range(50):
            pub.publish("slow/q0", payload, 0)
        return False

    # Never read: the node must drop.
    wait_until(dropped, 30, "a QoS 0 drop counted", every_s=0)
    other = Paho(mesh.node(1))  # the node still serves everyone else
    other.connect()
    other.subscribe("slow/other", 1)
    pub.publish("slow/other", "ok", 1)
    assert other.expect(1)[0].payload == b"ok"
    pub.close()
    other.close()
    raw.close()
