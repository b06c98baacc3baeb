"""A subscriber that stops reading must cost its node bounded memory, and lose nothing that
was acknowledged: its persistent session's messages wait in the durable queue, and it gets
every one when it reconnects.

`STARLING_TEST_SLOW_CONSUMER_N` sets how many 1 KiB QoS 1 messages are published (20,000 in
the suite; the issue's figure of 200,000 is run the same way, see docs/security.md).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time

from bench.loadgen import connect as load_connect
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    encode,
    encode_publish,
)
from tests.conftest import MeshInfo
from tests.security.bystander import Bystander, assert_unharmed

N = int(os.environ.get("STARLING_TEST_SLOW_CONSUMER_N", "20000"))
PAYLOAD = 1024
# What the node may grow by while the subscriber is stalled: its buffers for that one client
# (transport high-water mark, one queue read, bounded in-memory queue) plus interpreter noise.
RSS_BUDGET_MB = 16


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class _Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = _rss_mb(pid)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, _rss_mb(self.pid))


def _connect(client_id: str) -> Connect:
    expiry = Properties(session_expiry_interval=3600)
    return Connect(client_id, 5, clean_start=False, keepalive_s=0, properties=expiry)


def _stalled_subscriber(port: int, client_id: str) -> socket.socket:
    """Connect a persistent MQTT 5 session (no Receive Maximum: it accepts 65,535 in flight),
    subscribe at QoS 1, and never read again."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(encode(_connect(client_id), 5))
    dec = Decoder(5)
    got: list[object] = []
    while not any(isinstance(p, ConnAck) for p in got):
        got += dec.feed(sock.recv(4096))
    sock.sendall(encode(Subscribe(1, (Subscription("slow/#", 1),)), 5))
    while not any(isinstance(p, SubAck) for p in got):
        got += dec.feed(sock.recv(4096))
    return sock


async def _publish_all(port: int) -> int:
    """Publish N messages at QoS 1 (window of 200); return how many were acknowledged."""
    c = await load_connect(port, "slow-pub")
    assert c.transport is not None
    sent = 0
    while sent < N:
        while sent - c.acks >= 200:
            c.ack_event.clear()
            await asyncio.wait_for(c.ack_event.wait(), 30)
        buf = bytearray()
        for _ in range(min(32, N - sent)):
            sent += 1
            payload = struct.pack(">I", sent) + b"x" * (PAYLOAD - 4)
            buf += encode_publish(Publish("slow/t", payload, 1, False, False, sent % 65535 + 1), 4)
        c.transport.write(bytes(buf))
        await c.writable.wait()
    deadline = time.monotonic() + 60
    while c.acks < N and time.monotonic() < deadline:
        c.ack_event.clear()
        await asyncio.wait_for(c.ack_event.wait(), 30)
    c.transport.close()
    return c.acks


def _drain(port: int, client_id: str) -> set[int]:
    """Resume the session and read until every message arrived (or nothing for 10 s)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(encode(_connect(client_id), 5))
    dec = Decoder(5)
    seen: set[int] = set()
    while len(seen) < N:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not data:
            break
        acks = bytearray()
        for p in dec.feed(data):
            if isinstance(p, Publish):
                seen.add(struct.unpack(">I", p.payload[:4])[0])
                acks += encode(PubAck(p.packet_id or 0), 5)
        if acks:
            sock.sendall(bytes(acks))
    sock.close()
    return seen


def test_a_stalled_subscriber_costs_bounded_memory_and_loses_nothing(mesh: MeshInfo) -> None:
    """The stalled subscriber and a bystander are on node 0; the publisher is elsewhere, as
    the traffic of other tenants would be."""
    port = mesh.node(0)
    pid = mesh.mesh.by_name("connection-0").pid
    sub = _stalled_subscriber(port, "stalled-sub")
    before = _rss_mb(pid)
    sampler = _Sampler(pid)
    sampler.start()

    async def publish_beside_a_bystander() -> tuple[int, Bystander]:
        async with Bystander(port) as b:
            acked = await _publish_all(mesh.node(1))
            await asyncio.sleep(1.0)  # let the node do whatever it does with the backlog
        return acked, b

    acked, bystander = asyncio.run(publish_beside_a_bystander())
    sampler.stop.set()
    sampler.join()
    growth = sampler.peak - before
    sub.close()
    assert acked == N
    assert growth < RSS_BUDGET_MB, f"node RSS grew {growth:.0f} MB ({before:.0f} MB before)"
    assert_unharmed(bystander)
    seen = _drain(port, "stalled-sub")
    missing = N - len(seen)
    assert missing == 0, f"{missing} of {N} acknowledged messages never arrived"
    print(f"slow consumer: N={N} rss_before={before:.0f}MB growth={growth:.1f}MB")
