"""A node's lease on its clients (services/connection/lease.py): a node whose heartbeats no
session instance answers fences itself (every client told DISCONNECT 0x9C, MQTT 3.1.1
closed; a CONNECT refused with CONNACK 0x88; not ready) and unfences once answers resume.

Real NATS, Redis and core services (tests/conftest.py); the node runs in this process. The
answers are stopped the way the session service itself stops them while it releases a
node: its shared record of the node carries a release mark (services/session/liveness.py).
A Redis outage fences nobody: a node and a session service on a nats-server and a
redis-server of their own (tests/session/test_liveness_shared.py `own_servers`), Redis
paused with SIGSTOP for longer than the fence time.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from redis.asyncio import Redis

from services.common.mqtt import ConnAck, Connect, Disconnect
from services.connection.config import ConnectionSettings
from services.connection.lease import REASON
from services.connection.main import ConnectionService
from services.session.config import SessionSettings
from services.session.liveness import SEEN_KEY
from services.session.main import SessionService
from services.session.registry import Registry
from tests.e2e.clients import Raw
from tests.inproc import OPEN_TENANT, Core, serving
from tests.poll import eventually, holds_within_async
from tests.session.test_liveness_shared import own_servers

FENCE_S = 1.0
OUTAGE_FENCE_S = 5.0  # the default self_fence_s
# The session service's own release mark, at the Redis server's time.
MARK = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], 'r' .. (tonumber(t[1]) * 1000))
return 0
"""


def _settings(core: Core, nats_url: str, redis_url: str, tmp_path: Path) -> ConnectionSettings:
    return ConnectionSettings(
        node_id=f"lease-{uuid.uuid4().hex[:6]}",
        nats_url=nats_url,
        redis_url=redis_url,
        data_dir=tmp_path,
        metrics_port=-1,
        mqtt_host="127.0.0.1",
        mqtt_port=0,
        session_addr=core.session,
        router_addr=core.router,
        queue_addr=core.queue,
        metrics_addr=core.metrics,
        self_fence_s=FENCE_S,
    )


async def _connect(port: int, client_id: str, level: int = 5) -> tuple[Raw, ConnAck]:
    raw = await asyncio.to_thread(Raw, port)
    ack = await asyncio.to_thread(
        raw.connect, Connect(client_id=client_id, protocol_level=level, username=f"{OPEN_TENANT}/u")
    )
    assert isinstance(ack, ConnAck)
    return raw, ack


async def test_a_node_whose_heartbeats_go_unanswered_fences_and_unfences(
    core: Core, nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    service = ConnectionService(_settings(core, nats_url, redis_url, tmp_path))
    ready: list[bool] = []

    async def set_ready(ok: bool) -> None:
        ready.append(ok)

    redis = Redis.from_url(redis_url)
    async with serving(service):
        service.attach_readiness(set_ready)
        node, port = service.node, service.ports["mqtt"]
        assert node is not None
        await eventually(lambda: node.lease.confirmed_at is not None, 10, "a first answer")
        v5, ack5 = await _connect(port, "lease-v5")
        v3, ack3 = await _connect(port, "lease-v3", level=4)
        assert ack5.reason_code == 0 and ack3.reason_code == 0

        # Answers stop: the session service's record of the node is marked as released.
        await redis.eval(MARK, 1, SEEN_KEY, node.node_id)  # type: ignore[misc]
        try:
            told = await asyncio.to_thread(v5.recv, 10.0)
            assert isinstance(told, Disconnect) and told.reason_code == 0x9C
            assert await asyncio.to_thread(v3.closed, 10.0)
            assert node.lease.fenced and ready == [False]
            late, refused = await _connect(port, "lease-late")
            assert refused.reason_code == 0x88
            assert refused.properties.reason_string == REASON
            late.close()
        finally:
            await redis.hdel(SEEN_KEY, node.node_id)  # type: ignore[misc]

        # Answers resume: the node takes clients again.
        await eventually(lambda: not node.lease.fenced, 10, "the node unfencing")
        assert ready == [False, True]
        again, ack = await _connect(port, "lease-v5")
        assert ack.reason_code == 0
        for raw in (v5, v3, again):
            raw.close()
    await redis.aclose()


def _session_service(core: Core, common: dict[str, str], data_dir: Path) -> SessionService:
    """A session service of its own on `common`'s NATS and Redis (node timeout 2 s)."""
    return SessionService(
        SessionSettings(
            **common,
            data_dir=data_dir,
            metrics_port=-1,
            node_id="session-lease",
            router_addr=core.router,
            queue_addr=core.queue,
            anonymous_tenants=[OPEN_TENANT],
            node_timeout_s=2.0,
        )
    )


async def _check_not_released(redis: Redis, client_id: str, node_id: str) -> None:
    async def released() -> bool:
        held = await Registry(redis).get(OPEN_TENANT, client_id)
        return held is None or held.node_id != node_id

    # Must not happen: a release within three node timeouts (and a second).
    moved = await holds_within_async(released, 3 * 2.0 + 1, every_s=0.2)
    assert not moved, "the client's registry entry was released"


async def test_a_redis_outage_longer_than_the_fence_time_fences_no_node(
    core: Core, tmp_path: Path
) -> None:
    """Redis paused for longer than the fence time (the default, 5 s: it must exceed the
    3 s a session instance gives a heartbeat's write) while the node heartbeats: the node
    does not fence, its client is not disconnected, and after Redis is back the session
    service does not release the client while the node keeps heartbeating."""
    with own_servers(tmp_path) as servers:
        common = {"nats_url": servers.nats_url, "redis_url": servers.redis_url}
        session = _session_service(core, common, tmp_path / "session")
        (tmp_path / "node").mkdir(exist_ok=True)
        redis = Redis.from_url(servers.redis_url)
        async with serving(session) as session_addr:
            settings = _settings(core, **common, tmp_path=tmp_path / "node")
            update = {"session_addr": session_addr, "self_fence_s": OUTAGE_FENCE_S}
            service = ConnectionService(settings.model_copy(update=update))
            async with serving(service):
                node, port = service.node, service.ports["mqtt"]
                assert node is not None
                await eventually(lambda: node.lease.confirmed_at is not None, 10, "an answer")
                client, ack = await _connect(port, "outage-c")
                assert ack.reason_code == 0
                servers.pause_redis()
                try:
                    await asyncio.sleep(OUTAGE_FENCE_S + 3)  # the outage
                finally:
                    servers.resume_redis()
                assert not node.lease.fenced and node.lease.fences == 0
                assert not await asyncio.to_thread(client.closed, 0.2), "client disconnected"
                # Back: the node keeps beating, nobody releases its client.
                await _check_not_released(redis, "outage-c", node.node_id)
                assert node.lease.fences == 0
                assert not await asyncio.to_thread(client.closed, 0.2), "client disconnected"
                client.close()
        await redis.aclose()
