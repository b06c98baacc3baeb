"""Reconnect storm (issue 14): a node dies and all its persistent clients reconnect at once to
another node. Every session must resume (Session Present) with its subscription and with the
QoS 1 messages queued for it while it was away, and the registry must end up with exactly one
connection per client id (no duplicate session).

Its own two-node mesh (module-scoped, temporary folder), raw asyncio clients on the project's
codec (paho's threads do not scale to thousands of clients). Half the clients are MQTT 3.1.1
with Clean Session 0, half MQTT 5 with a Session Expiry Interval. `STARLING_STORM_CLIENTS`
sets how many (default 1,000, which fits in about 20 s on a small quiet machine; the
issue's 10,000 is the same test with the knob set).
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
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
)
from services.session.client import SessionAdminClient
from tests.poll import eventually

CLIENTS = int(os.environ.get("STARLING_STORM_CLIENTS", "1000"))
QUEUED = 2  # QoS 1 messages published to each client while it is away
OUTSTANDING = 256  # CONNECTs in flight at once in the storm (and 64 to set up)
TENANT = "default"

pytestmark = pytest.mark.timeout(max(300, CLIENTS // 5))


class StormClient(asyncio.Protocol):
    """One MQTT client: records its CONNACK and SUBACK, acknowledges QoS 1 publishes and
    keeps their payloads."""

    def __init__(self, client_id: str, level: int) -> None:
        self.client_id = client_id
        self.level = level
        self.decoder = Decoder(level)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[ConnAck] = loop.create_future()
        self.suback: asyncio.Future[SubAck] = loop.create_future()
        self.payloads: set[bytes] = set()
        self.pubacks = 0
        self.got = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        props = Properties(session_expiry_interval=3600) if self.level == 5 else Properties()
        connect = Connect(
            self.client_id, self.level, clean_start=False, keepalive_s=300, properties=props
        )
        self.transport.write(encode(connect, self.level))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for p in self.decoder.feed(data):
            if isinstance(p, Publish):
                self.payloads.add(p.payload)
                self.got.set()
                if p.qos == 1:
                    self.transport.write(encode(PubAck(p.packet_id or 0), self.level))
            elif isinstance(p, ConnAck) and not self.connack.done():
                self.connack.set_result(p)
            elif isinstance(p, SubAck) and not self.suback.done():
                self.suback.set_result(p)
            elif isinstance(p, PubAck):
                self.pubacks += 1
                self.got.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connack.done():
            self.connack.set_exception(ConnectionError("closed before CONNACK"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def client_id(i: int) -> str:
    return f"storm-{i}"


def level_of(i: int) -> int:
    return 5 if i % 2 else 4


async def open_all(
    port: int, ids: list[int], outstanding: int, subscribe: bool = False
) -> list[StormClient]:
    """Connect every client, `outstanding` CONNECTs in flight at a time; each stays open.
    `subscribe`: each then subscribes to its own topic at QoS 1 (before its slot is free:
    a persistent subscription is a round of calls in the mesh, so they are bounded too)."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(outstanding)

    async def one(i: int) -> StormClient:
        async with slots:
            _, c = await loop.create_connection(
                lambda: StormClient(client_id(i), level_of(i)), "127.0.0.1", port
            )
            await asyncio.wait_for(c.connack, 120)
            if subscribe:
                assert c.transport is not None
                sub = Subscription(f"storm/{c.client_id}", 1)
                c.transport.write(encode(Subscribe(1, (sub,)), c.level))
                assert (await asyncio.wait_for(c.suback, 120)).reason_codes == (1,)
            return c

    return list(await asyncio.gather(*(one(i) for i in ids)))


@dataclass
class Storm:
    launcher: Launcher
    admin: SessionAdminClient


@pytest.fixture(scope="module")
async def storm(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Storm]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert hard >= CLIENTS + 1000, f"RLIMIT_NOFILE {hard} is too low for {CLIENTS} clients"
    launcher = Launcher(
        data_dir=Path(tmp_path_factory.mktemp("storm")),
        nodes=2,
        mqtt_port=0,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "WARNING",
            # Every client comes from 127.0.0.1: no cap per address.
            "STARLING_MAX_CONNECTIONS_PER_IP": "0",
        },
    )
    await asyncio.to_thread(launcher.start, 90)
    admin = SessionAdminClient(
        f"127.0.0.1:{launcher.mesh.by_name('session').grpc_port}", launcher.admin_token
    )
    try:
        yield Storm(launcher, admin)
    finally:
        await admin.close()
        await asyncio.to_thread(launcher.stop)


async def _queue_for_each(pub: StormClient, ids: list[int]) -> int:
    """Publish QUEUED QoS 1 messages to each client's topic in a bounded window of
    unacknowledged publishes; return how many were sent, once all are acknowledged (stored)."""
    assert pub.transport is not None
    sent = 0
    for n in range(QUEUED):
        for i in ids:
            sent += 1
            payload = f"queued-{n}-{i}".encode()
            pub.transport.write(
                encode(Publish(f"storm/{client_id(i)}", payload, 1, packet_id=sent % 65535 + 1), 4)
            )
            if sent - pub.pubacks >= 500:  # a bounded window of unacknowledged publishes
                await eventually(
                    lambda s=sent: s - pub.pubacks < 250, 60, "publishes acknowledged", 0.1
                )
    await eventually(
        lambda: pub.pubacks == sent, 60, lambda: f"{pub.pubacks} of {sent} publishes acked", 0.1
    )
    return sent


def _publish_live(pub: StormClient, ids: list[int], sent: int) -> None:
    """One more message to each client, after the `sent` before it (for their packet ids)."""
    assert pub.transport is not None
    for i in ids:
        sent += 1
        pub.transport.write(
            encode(
                Publish(
                    f"storm/{client_id(i)}", f"live-{i}".encode(), 1, packet_id=sent % 65535 + 1
                ),
                4,
            )
        )


async def _check_every_message_arrives(ids: list[int], back: list[StormClient]) -> None:
    def expected(i: int) -> set[bytes]:
        return {f"queued-{n}-{i}".encode() for n in range(QUEUED)} | {f"live-{i}".encode()}

    def missing() -> list[str]:
        return [c.client_id for i, c in zip(ids, back, strict=True) if c.payloads != expected(i)]

    await eventually(
        lambda: not missing(), 120, lambda: f"messages missing for {len(missing())} clients", 0.1
    )


async def _check_one_connection_each(admin: SessionAdminClient, ids: list[int]) -> None:
    """Exactly one connection per client id, all on node 1."""
    held = [h for h in await admin.list_clients(TENANT) if h.client_id.startswith("storm-")]
    by_id: dict[str, list[str]] = {}
    for h in held:
        by_id.setdefault(h.client_id, []).append(h.node_id)
    expected_ids = {client_id(i) for i in ids} | {"storm-pub"}
    assert set(by_id) == expected_ids
    assert all(nodes == ["connection-1"] for nodes in by_id.values())


async def test_every_session_resumes_with_its_queue_after_a_reconnect_storm(
    storm: Storm,
) -> None:
    mesh = storm.launcher.mesh
    port0 = mesh.by_name("connection-0").port
    port1 = mesh.by_name("connection-1").port
    ids = list(range(CLIENTS))
    started = time.monotonic()

    # Every client connected to node 0 with a persistent session and a QoS 1 subscription.
    first = await open_all(port0, ids, 64, subscribe=True)
    assert all(not c.connack.result().session_present for c in first)
    setup_s = time.monotonic() - started

    # Node 0 dies: its clients are cut off, their registry entries still name it.
    await asyncio.to_thread(storm.launcher.kill, "connection-0")
    for c in first:
        c.close()

    # While they are away, QoS 1 messages are queued for each (PUBACK: stored).
    loop = asyncio.get_running_loop()
    _, pub = await loop.create_connection(lambda: StormClient("storm-pub", 4), "127.0.0.1", port1)
    await asyncio.wait_for(pub.connack, 30)
    sent = await _queue_for_each(pub, ids)

    # The storm: every client reconnects at once, to node 1.
    storm_started = time.monotonic()
    back = await open_all(port1, ids, OUTSTANDING)
    storm_s = time.monotonic() - storm_started
    refused = [c.client_id for c in back if c.connack.result().reason_code != 0]
    assert not refused, f"{len(refused)} refused, e.g. {refused[:5]}"
    fresh = [c.client_id for c in back if not c.connack.result().session_present]
    assert not fresh, f"{len(fresh)} sessions not resumed, e.g. {fresh[:5]}"

    # Each gets the messages queued for it, and its subscription is back: a message
    # published now arrives too.
    _publish_live(pub, ids, sent)
    await _check_every_message_arrives(ids, back)
    await _check_one_connection_each(storm.admin, ids)
    print(
        f"\nreconnect storm: {CLIENTS} clients, set-up {setup_s:.1f} s, "
        f"{CLIENTS / storm_s:,.0f} reconnects/s ({storm_s:.1f} s)"
    )
    for c in [*back, pub]:
        c.close()
