"""A node's copy of a tenant's route table (services/connection/replica.py) loads from the
routing snapshot plus only the route events logged after its checkpoint, which the router
reads from the store (services/router/copies.py): the copy equals the router's table, and
publishes keep their PUBACK promise while the router is killed and boots from the snapshot
and new nodes load their copies that way.

A private queue and router on their own data directory, NATS and Redis: a compaction of the
shared core's store would change what other tests see, and on the shared NATS the core's
queue service would answer this router's appends."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from services.cli.launcher import nats_binary
from services.cli.ports import free_port
from services.common.mqtt.packets import Subscription
from services.common.store.sqlite_session import SqliteSessionStore
from services.connection.replica import CopyRouter, RouteCopies
from services.queue.client import QueueClient, queue_id
from services.queue.config import QueueSettings
from services.queue.main import QueueService
from services.router.client import RouterClient, RouteResult
from services.router.compaction import compact
from services.router.config import RouterSettings
from services.router.main import RouterService
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from tests.conftest import wait_port
from tests.inproc import serving
from tests.poll import eventually

T = "boot"


@dataclass
class Mesh:
    data_dir: Path
    common: dict[str, object]
    queue_addr: str
    nc: Client
    queues: QueueClient
    router_cm: AbstractAsyncContextManager[str] | None = None
    router: RouterClient | None = None
    service: RouterService | None = None
    clients: list[RouterClient] = field(default_factory=list)

    async def start_router(self) -> RouterClient:
        settings = RouterSettings(**self.common, node_id="router-b", queue_addr=self.queue_addr)  # type: ignore[arg-type]
        self.service = RouterService(settings)
        self.router_cm = serving(self.service)
        addr = await self.router_cm.__aenter__()
        self.router = RouterClient(addr)
        self.router.use_bus(self.nc)
        self.clients.append(self.router)
        return self.router

    async def stop_router(self) -> None:
        assert self.router_cm is not None
        await self.router_cm.__aexit__(None, None, None)
        self.router_cm = None

    async def compact(self) -> int:
        store = SqliteSessionStore(self.data_dir / "sessions.db")
        try:
            return (await compact(store)).manifest.checkpoint
        finally:
            await store.close()


@pytest.fixture(scope="module")
def private_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(NATS URL, Redis URL) of servers only this module's services use."""
    folder = tmp_path_factory.mktemp("private")
    nats_port, redis_port = free_port(), free_port()
    conf = folder / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:{nats_port}"\njetstream {{ store_dir: "{folder}" }}\n')
    redis = shutil.which("redis-server")
    assert redis is not None, "redis-server is not installed (scripts/setup.sh installs it)"
    procs = [
        subprocess.Popen([nats_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL),
        subprocess.Popen(
            [redis, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        wait_port(nats_port, procs[0], "nats-server")
        wait_port(redis_port, procs[1], "redis-server")
        yield f"nats://127.0.0.1:{nats_port}", f"redis://127.0.0.1:{redis_port}/0"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@pytest.fixture
async def mesh(private_servers: tuple[str, str], tmp_path: Path) -> AsyncIterator[Mesh]:
    nats_url, redis_url = private_servers
    common: dict[str, object] = {
        "nats_url": nats_url,
        "redis_url": redis_url,
        "data_dir": tmp_path,
        "metrics_port": -1,
    }
    nc = await nats.connect(nats_url)
    queue_cm = serving(QueueService(QueueSettings(**common, node_id="queue-b")))  # type: ignore[arg-type]
    queue_addr = await queue_cm.__aenter__()
    queues = QueueClient(queue_addr)
    queues.use_bus(nc)
    m = Mesh(tmp_path, common, queue_addr, nc, queues)
    await m.start_router()
    try:
        yield m
    finally:
        if m.router_cm is not None:
            await m.stop_router()
        for c in (*m.clients, queues):
            await c.close()
        await queue_cm.__aexit__(None, None, None)
        await nc.close()


def msg(topic: str) -> RoutedMessage:
    """A publish whose payload is its message id (queue entries keep the payload)."""
    mid = uuid.uuid4().hex
    return RoutedMessage(
        tenant=T,
        topic=topic,
        payload=mid.encode(),
        qos=1,
        publisher=Publisher(client_id="pub", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=mid,
    )


async def ids_in(m: Mesh, client: str) -> list[str]:
    read = await m.queues.read(T, queue_id(client, 1), 1, 100_000)
    return [e.message.payload.decode() for e in read.entries]


async def test_a_new_nodes_copy_is_the_snapshot_plus_only_the_later_events(mesh: Mesh) -> None:
    m = mesh
    router = m.router
    assert router is not None
    for i in range(200):
        await router.subscribe(T, f"d{i}", 1, [(Subscription(f"dev/{i}/#", 1), None)])
    await router.subscribe(T, "all", 1, [(Subscription("dev/+/x", 2), 5)])
    await m.compact()
    # After the checkpoint: two subscriptions, an unsubscribe, a dropped session.
    await router.subscribe(T, "late", 1, [(Subscription("dev/7/x", 1), 9)])
    await router.subscribe(T, "d3", 1, [(Subscription("dev/3", 2), None)])
    await router.unsubscribe(T, "d5", 1, ["dev/5/#"])
    await router.drop_session(T, "d6", 1)

    snap = await router.route_snapshot(T, 10_000)
    full = await router.route_snapshot(T, 10_000, from_snapshot=False)
    assert snap.from_snapshot and snap.replayed == 4  # not the 201 subscriptions before
    assert not full.from_snapshot and snap.version == full.version
    assert set(snap.table.records(T)) == set(full.table.records(T))
    assert len(snap.table) == 200 + 1 + 2 - 2

    copies = RouteCopies(router, m.nc, 10_000)  # a newly started node
    route = CopyRouter(router, m.queues, copies)
    await eventually(lambda: copies.get(T) is not None, 10, "copy loaded")
    sent = [msg("dev/7/x"), msg("dev/5/a"), msg("dev/6/a"), msg("dev/3")]
    assert await route.route(sent) == [
        RouteResult.STORED,
        RouteResult.NO_MATCH,
        RouteResult.NO_MATCH,
        RouteResult.STORED,
    ]
    assert await ids_in(m, "late") == [sent[0].message_id]
    assert await ids_in(m, "all") == [sent[0].message_id]
    assert await ids_in(m, "d7") == [sent[0].message_id]
    assert await ids_in(m, "d3") == [sent[3].message_id]
    assert await ids_in(m, "d5") == [] and await ids_in(m, "d6") == []


class Flow:
    """Publishes through a node's copy, one at a time, until `stop`: what the node's pipeline
    does with TRY_LATER (keep it and try again, paced, until settled). `stored`: the ones
    confirmed STORED. `switch_to` moves it onto a newly started node's copy."""

    def __init__(self, copies: RouteCopies, route: CopyRouter) -> None:
        self.copies, self.route = copies, route
        self.stored: list[RoutedMessage] = []
        self.stop = asyncio.Event()

    def switch_to(self, copies: RouteCopies, route: CopyRouter) -> None:
        self.copies, self.route = copies, route

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            m_ = msg(f"f/{n % 5}/{n}")
            n += 1
            result = RouteResult.TRY_LATER
            while result is RouteResult.TRY_LATER and not self.stop.is_set():
                [result] = await self.route.route([m_])
                if result is RouteResult.TRY_LATER:
                    await asyncio.sleep(0.05)
            if result is not RouteResult.TRY_LATER:
                assert result is RouteResult.STORED
                self.stored.append(m_)


async def _restart_the_router_under(m: Mesh, flow: Flow) -> None:
    """Kill the router while publishes flow, boot it from the snapshot, and move the flow
    onto a newly started node that loads its copy from snapshot + tail."""
    stored = flow.stored
    await eventually(lambda: len(stored) >= 50, 10, "publishes before the restart")
    await m.stop_router()  # killed while publishes flow
    await eventually(lambda: len(stored) >= 80, 10, "the copy routes while the router is down")
    new_router = await m.start_router()
    assert m.service is not None and m.service.boot is not None
    assert m.service.boot.source == "snapshot" and m.service.boot.replayed == 1
    await flow.copies.stop()
    copies = RouteCopies(new_router, m.nc, 10_000)  # a newly started node
    await copies.start()
    flow.switch_to(copies, CopyRouter(new_router, m.queues, copies))
    await eventually(lambda: copies.get(T) is not None, 10, "new node's copy loaded")
    seen = len(stored)
    await eventually(lambda: len(stored) >= seen + 50, 10, "publishes after the restart")


async def test_publishes_flow_while_the_router_restarts_from_the_snapshot(mesh: Mesh) -> None:
    """Publishes go through a node's copy while subscriptions change, the router is killed
    and boots from the snapshot, and a new node loads its copy from snapshot + tail: every
    publish confirmed STORED is in every queue whose subscription matched it, once."""
    m = mesh
    router = m.router
    assert router is not None
    for i in range(50):
        await router.subscribe(T, f"s{i}", 1, [(Subscription(f"f/{i % 5}/#", 1), None)])
    await m.compact()
    await router.subscribe(T, "s50", 1, [(Subscription("f/0/#", 1), None)])  # the tail

    copies = RouteCopies(router, m.nc, 10_000)
    await copies.start()
    flow = Flow(copies, CopyRouter(router, m.queues, copies))
    task = asyncio.create_task(flow.run())
    try:
        await _restart_the_router_under(m, flow)
    finally:
        flow.stop.set()
        await task
        await flow.copies.stop()
    snap = await m.router.route_snapshot(T, 10_000) if m.router else None
    assert snap is not None and snap.from_snapshot and snap.replayed == 1
    for i in range(51):
        want = [x.message_id for x in flow.stored if x.topic.startswith(f"f/{i % 5}/")]
        assert await ids_in(m, f"s{i}") == want, f"s{i}"
