"""Services started in the test's own process and event loop, on free ports, the way
`run_service` starts them (register, start, SERVING; stop, then the server), with their doors
locked as in production: internal calls need MESH_SECRET (this process sends it), admin calls
ADMIN_TOKEN."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from services.common.rpc.admin_auth import TokenResolver
from services.common.rpc.credentials import set_mesh_secret
from services.common.rpc.server import ServerAuth, create_server, set_serving, stop_server
from services.common.runtime import Service
from services.metrics.config import MetricsSettings
from services.metrics.main import MetricsService
from services.queue.config import QueueSettings
from services.queue.main import QueueService
from services.router.config import RouterSettings
from services.router.main import RouterService
from services.session.config import SessionSettings
from services.session.main import SessionService

ADMIN_TOKEN = "inproc-admin-token"
MESH_SECRET = "inproc-mesh-secret"
OPEN_TENANT = "open"  # the core session service lets anonymous clients into this tenant


def inproc_auth(tokens: TokenResolver | None = None) -> ServerAuth:
    """The doors of an in-process server; this process's clients get the mesh secret."""
    set_mesh_secret(MESH_SECRET)
    return ServerAuth(mesh_secret=MESH_SECRET, admin_token=ADMIN_TOKEN, tokens=tokens)


@asynccontextmanager
async def queue_service(
    nats_url: str, redis_url: str, data_dir: Path, node_id: str, **settings: object
) -> AsyncIterator[str]:
    """A queue service with partitions of its own (its lease keys apart from any other's);
    yields its address."""
    qs = QueueSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        queue_lease_key_prefix=f"{uuid.uuid4().hex}:",
        data_dir=data_dir,
        metrics_port=-1,
        node_id=node_id,
        **settings,  # type: ignore[arg-type]
    )
    async with serving(QueueService(qs)) as addr:
        yield addr


@asynccontextmanager
async def serving(service: Service) -> AsyncIterator[str]:
    """Yields the service's gRPC address ("127.0.0.1:<port>"). The session service resolves
    tenant admin tokens itself; the others here know only the operator token."""
    auth = inproc_auth(getattr(service, "admin_tokens", None))
    server, port, health = create_server("127.0.0.1:0", service.register, auth=auth)
    await server.start()
    await service.start()
    await set_serving(health, [])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await service.stop()
        await stop_server(server, health, 0.5)


@dataclass(frozen=True)
class Core:
    """gRPC addresses of the services a connection node talks to."""

    queue: str
    router: str
    session: str
    metrics: str


@asynccontextmanager
async def core_services(nats_url: str, redis_url: str, data_dir: Path) -> AsyncIterator[Core]:
    """Queue, router, session and metrics services wired to one another (SQLite stores)."""
    common = {"nats_url": nats_url, "redis_url": redis_url, "data_dir": data_dir}
    common["metrics_port"] = -1
    async with AsyncExitStack() as stack:
        # First: the others report to it.
        metrics = await stack.enter_async_context(
            serving(
                MetricsService(
                    MetricsSettings(
                        **common, node_id="metrics-t", cluster_metrics_port=-1, sys_interval_s=0
                    )
                )
            )
        )
        common["metrics_addr"] = metrics
        queue = await stack.enter_async_context(
            serving(
                QueueService(
                    QueueSettings(
                        **common,
                        node_id="queue-t",
                        # Partition leases of its own in the tests' shared Redis.
                        queue_lease_key_prefix=f"inproc-{uuid.uuid4().hex}:",
                    )
                )
            )
        )
        router_settings = RouterSettings(**common, node_id="router-t", queue_addr=queue)
        router = await stack.enter_async_context(serving(RouterService(router_settings)))
        session_settings = SessionSettings(
            **common,
            node_id="session-t",
            router_addr=router,
            queue_addr=queue,
            anonymous_tenants=[OPEN_TENANT],
        )
        session = await stack.enter_async_context(serving(SessionService(session_settings)))
        yield Core(queue, router, session, metrics)
