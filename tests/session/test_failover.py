"""A Sentinel failover to a replica that lagged is handled as "Redis lost its data".

Setup (all real processes): a primary, a replica that replicates it through a proxy the test
can freeze, and a Sentinel (quorum 1); a session service and two connection nodes in this
process with `redis_mode=sentinel`, beside the router and queue of tests/inproc.py.

Client X connects to node A while replication is frozen: its claim is on the primary only.
The primary is killed; the Sentinel promotes the replica, which never got X's claim (but has
the registry's generation sentinel, so the sentinel check alone sees nothing). X connects to
node B: the registry has no entry for X, so nothing kicks A's copy. Without the session
service's primary check (services/session/failover.py) X would keep two live connections;
with it, A's copy gets DISCONNECT 0x8E and the registry names B alone.
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

import pytest
from redis.asyncio import Redis

from services.cli.ports import free_port
from services.cli.redis_sentinel import MASTER_NAME, sentinel_conf, server_conf
from services.common.mqtt import ConnAck, Connect
from services.connection.config import ConnectionSettings
from services.connection.main import ConnectionService
from services.session.config import SessionSettings
from services.session.failover import PRIMARY
from services.session.liveness import SEEN_KEY
from services.session.main import SessionService
from services.session.registry import Registry
from tests.conftest import wait_port
from tests.e2e.clients import Raw
from tests.inproc import Core, serving
from tests.poll import eventually, wait_until
from tests.session.test_fence import kicked_with

PASSWORD = "failover-redis-password"
KICK_BOUND_S = 10.0  # A's copy must be closed within this after X connected to B


def _spawn(folder: Path, name: str, text: str, *extra: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed"
    conf = folder / f"{name}.conf"
    conf.write_text(text)
    log = open(folder / f"{name}.log", "ab")
    return subprocess.Popen([binary, str(conf), *extra], stdout=log, stderr=subprocess.STDOUT)


class FreezableProxy:
    """Forwards a port to a target; `freeze()` stops forwarding both ways and keeps both
    sockets open, so what the primary sends from then on never reaches the replica, and the
    replica does not see its link drop."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers += [writer, up_writer]
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()

    def freeze(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        self.freeze()
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()


@dataclass
class Setup:
    primary: subprocess.Popen[bytes]
    on_primary: Redis
    on_replica: Redis
    proxy: FreezableProxy
    ports: tuple[int, int]
    node_ids: tuple[str, str]


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[dict[str, tuple[int, subprocess.Popen[bytes]]]]:
    started: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
    yield started
    for _, proc in started.values():
        proc.kill()
        proc.wait(10)


async def _redis_setup(
    folder: Path, started: dict[str, tuple[int, subprocess.Popen[bytes]]]
) -> FreezableProxy:
    """Primary, frozen-able replication link, replica, one Sentinel (quorum 1)."""
    p_port, r_port, s_port = free_port(), free_port(), free_port()
    started["primary"] = (
        p_port,
        _spawn(folder, "primary", server_conf(port=p_port, folder=str(folder), password=PASSWORD)),
    )
    wait_port(p_port, started["primary"][1], "the primary redis-server")
    proxy = FreezableProxy(p_port)
    await proxy.start()
    text = server_conf(port=r_port, folder=str(folder), password=PASSWORD, primary=proxy.port)
    started["replica"] = r_port, _spawn(folder, "replica", text)
    # A long failover timeout: the Sentinel leaves the replica's odd primary address alone.
    text = sentinel_conf(
        port=s_port, folder=str(folder), password=PASSWORD, primary=p_port, quorum=1,
        down_after_ms=1000, failover_timeout_ms=120_000,
    )  # fmt: skip
    started["sentinel"] = s_port, _spawn(folder, "sentinel", text, "--sentinel")
    for port, proc in started.values():
        wait_port(port, proc, "redis-server")
    sentinel = Redis(host="127.0.0.1", port=s_port, password=PASSWORD)

    async def replica_known() -> bool:
        state = await sentinel.sentinel_master(MASTER_NAME)
        return int(state.get("num-slaves", 0)) >= 1

    await eventually(replica_known, 30, "the Sentinel knows the replica")
    await sentinel.aclose()
    return proxy


@pytest.fixture
async def setup(
    core: Core,
    nats_url: str,
    tmp_path: Path,
    processes: dict[str, tuple[int, subprocess.Popen[bytes]]],
) -> AsyncIterator[Setup]:
    proxy = await _redis_setup(tmp_path, processes)
    common = {
        "nats_url": nats_url,
        "redis_mode": "sentinel",
        "redis_sentinels": [f"127.0.0.1:{processes['sentinel'][0]}"],
        "redis_master_name": MASTER_NAME,
        "redis_password": PASSWORD,
        "redis_sentinel_password": PASSWORD,
        "metrics_port": -1,
        "session_subject": f"svc.session.failover{uuid.uuid4().hex[:6]}",
    }
    session = SessionService(
        SessionSettings(
            **common,
            data_dir=tmp_path / "session",
            node_id="session-failover",
            router_addr=core.router,
            queue_addr=core.queue,
            anonymous_tenants=["*"],
        )
    )
    on_primary = Redis(host="127.0.0.1", port=processes["primary"][0], password=PASSWORD)
    on_replica = Redis(host="127.0.0.1", port=processes["replica"][0], password=PASSWORD)
    async with serving(session) as session_addr:
        nodes = []
        ids = (f"fo-a-{uuid.uuid4().hex[:4]}", f"fo-b-{uuid.uuid4().hex[:4]}")
        for node_id in ids:
            settings = ConnectionSettings(
                **common, node_id=node_id, mqtt_port=0, mqtt_host="127.0.0.1", ws_port=-1,
                session_addr=session_addr, router_addr=core.router, queue_addr=core.queue,
            )  # fmt: skip
            svc = ConnectionService(settings)
            await svc.start()
            nodes.append(svc)
        ports = (nodes[0].ports["mqtt"], nodes[1].ports["mqtt"])
        try:
            yield Setup(processes["primary"][1], on_primary, on_replica, proxy, ports, ids)
        finally:
            for svc in nodes:
                await svc.stop()
            await proxy.close()
            await on_primary.aclose()
            await on_replica.aclose()


def connect(port: int, client_id: str, timeout_s: float = 0.0) -> Raw:
    """CONNECT until accepted (within `timeout_s`: while the primary fails over, the session
    service cannot answer)."""

    def accepted() -> Raw | None:
        raw = Raw(port)
        try:
            ack = raw.connect(Connect(client_id, 5, clean_start=True, keepalive_s=30))
        except (OSError, TimeoutError):
            ack = None
        if isinstance(ack, ConnAck) and ack.reason_code == 0:
            return raw
        raw.close()
        return None

    return wait_until(accepted, timeout_s, f"CONNECT of {client_id} accepted", every_s=0.2)


async def test_failover_to_a_lagging_replica_leaves_one_connection(setup: Setup) -> None:
    a, b = setup.ports
    tenant = "default"
    on_replica = Registry(setup.on_replica)
    # Before the freeze the replica has the registry's records (generation, primary) and
    # an earlier client's claim: the promoted replica is not empty, only behind.
    early_id = f"early-{uuid.uuid4().hex[:6]}"
    early = await asyncio.to_thread(connect, a, early_id)
    await eventually(lambda: setup.on_replica.get(PRIMARY), 10, "the primary record replicated")
    await eventually(lambda: on_replica.get(tenant, early_id), 10, "an early claim replicated")
    for node_id in setup.node_ids:  # the nodes' liveness records too (a running mesh's)

        async def seen(node: str = node_id) -> object:
            return await setup.on_replica.hget(SEEN_KEY, node)  # type: ignore[misc]

        await eventually(seen, 10, f"{node_id}'s liveness record replicated")
    setup.proxy.freeze()
    cid = f"x-{uuid.uuid4().hex[:6]}"
    on_a = await asyncio.to_thread(connect, a, cid)
    await eventually(lambda: Registry(setup.on_primary).get(tenant, cid), 10, "X's claim")
    assert await on_replica.get(tenant, cid) is None  # the claim did not reach the replica
    setup.primary.kill()
    setup.primary.wait(10)
    started = time.monotonic()
    on_b = await asyncio.to_thread(connect, b, cid, 60.0)
    print(f"\nCONNECT accepted {time.monotonic() - started:.1f}s after the primary was killed")
    # A's copy is taken over; B's stays, and the registry (on the promoted replica) names B.
    code = await asyncio.to_thread(kicked_with, on_a, KICK_BOUND_S)
    assert code == 0x8E, f"A's copy of {cid} still live (or closed otherwise: {code})"
    assert await asyncio.to_thread(kicked_with, on_b, 0.5) is None

    async def held_by_b() -> bool:
        h = await on_replica.get(tenant, cid)
        return h is not None and h.node_id == setup.node_ids[1]

    await eventually(held_by_b, 10, "the registry naming B")
    for raw in (on_a, on_b, early):
        raw.close()
