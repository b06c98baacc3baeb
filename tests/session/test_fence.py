"""Takeover fencing survives Redis losing its data: a session service and two connection nodes
in this process, on a redis-server of their own (flushed and restarted empty here, which the
shared one of tests/conftest.py must not be), beside the router and queue of tests/inproc.py.

Client X connected to node A, Redis loses everything, X connects to node B: A's copy is closed
with DISCONNECT 0x8E, the registry names one holder, messages flow; and of two CONNECTs racing
after the loss exactly one connection survives.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from services.cli.ports import free_port
from services.common.mqtt import ConnAck, Connect, Disconnect, Publish, SubAck, Subscribe
from services.common.mqtt import Subscription as Sub
from services.connection.config import ConnectionSettings
from services.connection.main import ConnectionService
from services.session.config import SessionSettings
from services.session.main import SessionService
from services.session.registry import GENERATION, Holder, Registry
from tests.conftest import wait_port
from tests.e2e.clients import Raw
from tests.inproc import Core, serving
from tests.poll import eventually, wait_until

PASSWORD = "fence-redis-password"
KICK_BOUND_S = 5.0  # A's copy must be closed within this after X connects to B


class RedisServer:
    """A redis-server without persistence that a test can restart empty on the same port."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--requirepass", PASSWORD],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_port(self.port, self.proc, "redis-server")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@dataclass
class Fenced:
    redis: RedisServer
    registry: Registry
    ports: tuple[int, int]
    node_ids: tuple[str, str]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("fence-redis"))
    server.start()
    yield server
    server.stop()


def _node_settings(
    core: Core, common: dict[str, Any], node_id: str, session_addr: str
) -> ConnectionSettings:
    """A connection node of the fence's own session service, on `common`'s NATS and Redis."""
    return ConnectionSettings(
        **common,
        node_id=node_id,
        mqtt_port=0,
        mqtt_host="127.0.0.1",
        ws_port=-1,
        session_addr=session_addr,
        router_addr=core.router,
        queue_addr=core.queue,
    )


@pytest.fixture(scope="module")
async def fenced(
    core: Core, nats_url: str, own_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fenced]:
    # Its own session service: the nodes' CONNECTs (NATS) must reach it, not the core's.
    common = {
        "nats_url": nats_url,
        "redis_url": own_redis.url,
        "metrics_port": -1,
        "session_subject": f"svc.session.fence{uuid.uuid4().hex[:6]}",
    }
    settings = SessionSettings(
        **common,
        data_dir=tmp_path_factory.mktemp("fence-session"),
        node_id="session-fence",
        router_addr=core.router,
        queue_addr=core.queue,
        anonymous_tenants=["*"],
    )
    async with serving(SessionService(settings)) as session_addr:
        nodes = []
        ids = (f"fence-a-{uuid.uuid4().hex[:4]}", f"fence-b-{uuid.uuid4().hex[:4]}")
        for node_id in ids:
            svc = ConnectionService(_node_settings(core, common, node_id, session_addr))
            await svc.start()
            nodes.append(svc)
        redis = Redis.from_url(
            own_redis.url,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[RedisConnectionError],
        )
        try:
            yield Fenced(
                own_redis,
                Registry(redis),
                (nodes[0].ports["mqtt"], nodes[1].ports["mqtt"]),
                ids,
            )
        finally:
            await redis.aclose()
            for svc in nodes:
                await svc.stop()


def connect(port: int, client_id: str) -> Raw:
    raw = Raw(port)
    ack = raw.connect(Connect(client_id, 5, clean_start=True, keepalive_s=30))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def kicked_with(raw: Raw, timeout_s: float) -> int | None:
    """The reason code of the DISCONNECT the server sent before closing (None: still open)."""
    if not raw.closed(timeout_s):
        return None
    codes = [p.reason_code for p in raw.pending if isinstance(p, Disconnect)]
    return codes[-1] if codes else -1


async def holders(f: Fenced, tenant: str) -> list[Holder]:
    return await f.registry.list(tenant)


async def flows(f: Fenced, survivor: Raw, survivor_port: int) -> None:
    """The survivor subscribes; a publisher on the other node reaches it."""
    topic = f"fence/{uuid.uuid4().hex[:6]}"

    def subscribe() -> None:
        survivor.send(Subscribe(1, (Sub(topic, 1),)))
        assert isinstance(survivor.recv(), SubAck)

    await asyncio.to_thread(subscribe)
    other = f.ports[1] if survivor_port == f.ports[0] else f.ports[0]
    pub = await asyncio.to_thread(connect, other, f"pub-{uuid.uuid4().hex[:6]}")
    try:
        # Subscriptions reach the other node through the mesh: publish until one arrives.
        def receive() -> Publish | None:
            pub.send(Publish(topic, b"after-loss", qos=0))
            try:
                p = survivor.recv(timeout=0.3)
            except TimeoutError:
                return None
            return p if isinstance(p, Publish) else None

        what = "a message reaching the survivor"
        got = await asyncio.to_thread(wait_until, receive, 10, what, 0.0)
        assert got.payload == b"after-loss"
    finally:
        pub.close()


async def test_epochs_keep_growing_without_redis_and_leave_no_keys(fenced: Fenced) -> None:
    reg, tenant = fenced.registry, f"fe{uuid.uuid4().hex[:6]}"
    first = await reg.claim(Holder(tenant, "x", "node-a", reg.next_epoch()))
    assert first.won
    await reg._redis.flushall()  # type: ignore[misc]
    after = await reg.claim(Holder(tenant, "x", "node-b", reg.next_epoch()))
    # A fresh registry, noticed by the claim itself; the new epoch still outranks the old.
    assert after.won and after.previous is None and after.generation
    assert after.epoch > first.epoch
    # The old connection re-asserts: refused, the later one stays.
    late = await reg.reclaim(Holder(tenant, "x", "node-a", first.epoch))
    assert not late.won and late.previous is not None and late.previous.node_id == "node-b"
    assert (await reg.get(tenant, "x")).node_id == "node-b"  # type: ignore[union-attr]
    # Re-asserting the current holder again changes nothing.
    same = await reg.reclaim(Holder(tenant, "x", "node-b", after.epoch, owner=None))
    assert same.won and not same.generation
    # No counter key per client id any more.
    assert await reg._redis.keys("st:epoch:*") == []


async def test_connect_above_a_higher_installed_epoch_still_wins(fenced: Fenced) -> None:
    """A re-asserted (or clock-skewed) epoch above ours: the CONNECT is the latest, it wins."""
    reg, tenant = fenced.registry, f"fe{uuid.uuid4().hex[:6]}"
    ahead = reg.next_epoch() + 10_000_000  # ten seconds ahead
    assert (await reg.reclaim(Holder(tenant, "x", "node-a", ahead))).won
    claim = await reg.claim(Holder(tenant, "x", "node-b", reg.next_epoch()))
    assert claim.won and claim.epoch > ahead
    assert claim.previous is not None and claim.previous.node_id == "node-a"


@pytest.mark.parametrize("loss", ["flushall", "restart"])
async def test_stale_copy_is_kicked_after_redis_loses_its_data(fenced: Fenced, loss: str) -> None:
    a, b = fenced.ports
    cid = f"x-{loss}-{uuid.uuid4().hex[:6]}"
    tenant = "default"
    on_a = await asyncio.to_thread(connect, a, cid)
    await eventually(lambda: fenced.registry.get(tenant, cid))
    if loss == "flushall":
        await fenced.registry._redis.flushall()  # type: ignore[misc]
    else:
        fenced.redis.stop()
        fenced.redis.start()  # empty: no persistence
    start = time.monotonic()
    on_b = await asyncio.to_thread(connect, b, cid)
    code = await asyncio.to_thread(kicked_with, on_a, KICK_BOUND_S)
    assert code == 0x8E, f"A's copy not closed as taken over within {KICK_BOUND_S}s: {code}"
    assert time.monotonic() - start < KICK_BOUND_S
    # One holder, the connection on B; and B's copy lives and works.
    await eventually(lambda: _holds(fenced, tenant, cid, fenced.node_ids[1]))
    assert [h.client_id for h in await holders(fenced, tenant) if h.client_id == cid] == [cid]
    assert await asyncio.to_thread(kicked_with, on_b, 0.3) is None
    await flows(fenced, on_b, b)
    on_b.close()
    on_a.close()


async def test_registry_is_rebuilt_when_no_connect_notices_the_loss(fenced: Fenced) -> None:
    a, b = fenced.ports
    cid = f"x-rebuilt-{uuid.uuid4().hex[:6]}"
    on_a = await asyncio.to_thread(connect, a, cid)
    await eventually(lambda: fenced.registry.get("default", cid))
    await fenced.registry._redis.flushall()  # type: ignore[misc]
    # Noticed by the session service's sentinel check; node A re-asserts its connection.
    await eventually(lambda: _holds(fenced, "default", cid, fenced.node_ids[0]))
    # The node's heartbeat may re-assert before the check writes the new generation.
    await eventually(lambda: fenced.registry._redis.get(GENERATION), what="a new generation")
    # An ordinary takeover from there on.
    on_b = await asyncio.to_thread(connect, b, cid)
    assert await asyncio.to_thread(kicked_with, on_a, KICK_BOUND_S) == 0x8E
    await eventually(lambda: _holds(fenced, "default", cid, fenced.node_ids[1]))
    on_b.close()
    on_a.close()


async def test_two_connects_racing_after_the_loss_leave_exactly_one(fenced: Fenced) -> None:
    a, b = fenced.ports
    cid = f"x-race-{uuid.uuid4().hex[:6]}"
    old = await asyncio.to_thread(connect, a, cid)
    await eventually(lambda: fenced.registry.get("default", cid))
    await fenced.registry._redis.flushall()  # type: ignore[misc]
    racers = await asyncio.gather(
        asyncio.to_thread(connect, a, cid), asyncio.to_thread(connect, b, cid)
    )
    # The old copy always loses; of the racers, whichever ended installed survives alone.
    assert await asyncio.to_thread(kicked_with, old, KICK_BOUND_S) == 0x8E
    open_ports = []
    for port, raw in zip((a, b), racers, strict=True):
        if await asyncio.to_thread(kicked_with, raw, 1.5) is None:
            open_ports.append(port)
    assert len(open_ports) == 1, f"{len(open_ports)} connections survived"
    holder = await fenced.registry.get("default", cid)
    assert holder is not None
    assert holder.node_id == fenced.node_ids[fenced.ports.index(open_ports[0])]
    for raw in (old, *racers):
        raw.close()


async def _holds(f: Fenced, tenant: str, client_id: str, node_id: str) -> bool:
    h = await f.registry.get(tenant, client_id)
    return h is not None and h.node_id == node_id


async def test_a_reasserted_connection_keeps_its_will(fenced: Fenced) -> None:
    """The registry entry holds the will the session service publishes if node A dies; after
    Redis lost it, A's re-assertion hands it again."""
    import base64

    from services.common.mqtt import Will
    from services.common.mqtt.properties import Properties
    from starling.common.v1.message_pb2 import RoutedMessage

    a, _ = fenced.ports
    cid = f"x-will-{uuid.uuid4().hex[:6]}"
    raw = Raw(a)
    will = Will(f"status/{cid}", b"offline", 1, True)
    connect = Connect(
        cid, 5, clean_start=False, will=will, properties=Properties(session_expiry_interval=60)
    )
    ack = await asyncio.to_thread(raw.connect, connect)  # the node runs in this event loop
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack

    async def kept_will() -> tuple[str, bytes, bool] | None:
        h = await fenced.registry.get("default", cid)
        if h is None or not h.will:
            return None
        env = RoutedMessage.FromString(base64.b64decode(h.will))
        return env.topic, env.payload, env.retain

    assert await kept_will() == (f"status/{cid}", b"offline", True)
    await fenced.registry._redis.flushall()  # type: ignore[misc]
    await eventually(lambda: _holds(fenced, "default", cid, fenced.node_ids[0]))
    await eventually(kept_will)
    assert await kept_will() == (f"status/{cid}", b"offline", True)
    raw.send(Disconnect())
    raw.close()
