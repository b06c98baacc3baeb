"""Process runtime shared by every service: config, logging, telemetry, gRPC, signals.

A service provides a `Service` (register servicers, start, stop); `run_service` does the rest:
validates settings (exit 2 with a message naming the bad setting, or a missing secret), logs
the effective config with secrets redacted (and scrubs them from every later line), locks the
gRPC doors (mesh secret on internal APIs, admin tokens on admin APIs, see
services/common/rpc/interceptors.py), serves gRPC health and reflection, reports SERVING once
`start` returns (NOT_SERVING before), and on SIGTERM/SIGINT reports NOT_SERVING, stops the
server (calls under way finish) and then the service, within the grace period.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc

from services.common.config import ConfigError, ServiceSettings, load_settings
from services.common.logs import setup_logging
from services.common.redact import register_secrets
from services.common.rpc.admin_auth import CachedTokenResolver, TokenResolver
from services.common.rpc.audit import AuditLog
from services.common.rpc.credentials import set_mesh_secret
from services.common.rpc.server import (
    NOT_SERVING,
    SERVING,
    ServerAuth,
    create_server,
    set_not_serving,
    set_serving,
    stop_server,
)
from services.common.store.open import open_audit_store
from services.common.telemetry import setup_telemetry

log = logging.getLogger("starling.runtime")
# gRPC health service name of liveness probes: SERVING while the process is worth keeping.
# It stays SERVING while the service drains (NOT_SERVING on "" and the service names sends
# load balancers away, but the orchestrator must not kill the process mid-drain); it turns
# NOT_SERVING, for good, when the service can no longer carry traffic for any other reason.
LIVENESS = "liveness"
# The `unhealthy` reason of a service taking itself out of service on purpose.
DRAINING = "draining"
# gc thresholds 2 (CPython's default is 10) and 0 (CPython's default is 700): see
# _settle_the_heap().
FULL_COLLECTION_EVERY = 100
YOUNG_COLLECTION_EVERY = 7_000


class Service(Protocol):
    """What `run_service` runs. A service that can lose the ability to serve while it runs
    (its bus, say) may also have `unhealthy: asyncio.Future[str]`: once it has a result (the
    reason), health checks answer NOT_SERVING for good. One that may end its own work (a
    drained node) may have `finished: asyncio.Future[None]`: once resolved, the process stops
    as on SIGTERM."""

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        """Add gRPC servicers; return their full service names."""

    async def start(self) -> None:
        """Connect to dependencies and begin work; return once ready to serve."""

    async def stop(self) -> None:
        """Stop work; called once on shutdown, before the gRPC server stops."""


S = TypeVar("S", bound=ServiceSettings)


def _follow_health(
    service: Service, health: Any, names: list[str], name: str
) -> asyncio.Task[None] | None:
    """Keep the service's gRPC health current after start-up: readiness changes it reports
    (a fenced node leaves the pool for a while) and its `unhealthy` future (draining, or a
    fatal fault, which also ends liveness). Returns the watcher task, if any."""
    attach = getattr(service, "attach_readiness", None)
    if attach is not None:
        attach(lambda ready: (set_serving if ready else set_not_serving)(health, names))
    unhealthy: asyncio.Future[str] | None = getattr(service, "unhealthy", None)
    if unhealthy is None:
        return None

    async def watch(f: asyncio.Future[str]) -> None:
        reason = await f
        if reason == DRAINING:
            log.warning("service_not_serving", extra={"service": name, "reason": reason})
        else:
            log.error("service_not_serving", extra={"service": name, "reason": reason})
            await health.set(LIVENESS, NOT_SERVING)
        await set_not_serving(health, names)

    return asyncio.create_task(watch(unhealthy))


async def serve(settings: ServiceSettings, service: Service, name: str) -> None:
    """Run `service` until SIGTERM/SIGINT (or cancellation)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    names: list[str] = []

    def register(server: grpc.aio.Server) -> Iterable[str]:
        names.extend(service.register(server))
        return names

    auth = server_auth(settings, getattr(service, "admin_tokens", None))
    server, port, health = create_server(
        f"{settings.grpc_host}:{settings.grpc_port}", register, auth=auth
    )
    # The health servicer answers SERVING from birth: NOT_SERVING until `start` returns, or
    # whoever polls health (the launcher, an orchestrator) sends clients to listeners that
    # are not bound yet.
    await set_not_serving(health, names)
    await health.set(LIVENESS, SERVING)
    await server.start()
    try:
        await service.start()
    except Exception:
        log.exception("service_start_failed", extra={"service": name})
        await server.stop(0)
        raise
    await set_serving(health, names)
    watcher = _follow_health(service, health, names, name)
    finished: asyncio.Future[None] | None = getattr(service, "finished", None)
    if finished is not None:
        finished.add_done_callback(lambda _: stop.set())
    _settle_the_heap()
    log.info("service_serving", extra={"service": name, "grpc_port": port})
    try:
        await stop.wait()
    finally:
        log.info("service_stopping", extra={"service": name})
        if watcher is not None:
            watcher.cancel()
        await _stop(settings.shutdown_grace_s, server, health, service, auth, name)


def _settle_the_heap() -> None:
    """Everything built during start-up lives for the whole process: move it out of the
    collector's sight so full collections stay short (tail latency on the hot path)."""
    gc.collect()
    gc.freeze()
    # Full collections considered every 100 middle-generation passes, not 10: each walks every
    # live connection, and a node accepting 10,000 CONNECTs spent about a third of its CPU per
    # CONNECT in them (bench.connects), with pauses of ~0.15 s for every client on the node.
    # Cyclic garbage that reached the old generation lives longer; it stays bounded by it.
    # Young collections every 7,000 net allocations, not 700: a QoS 1 message makes a few
    # dozen short-lived objects, and the young passes were 3.5% of a node's CPU (perf);
    # bench.pairs --qos 1, 6 rounds each, back to back: node CPU per message median 8.2 µs
    # at 700, 7.35 µs at 7,000. Cyclic garbage waits up to 7,000 allocations longer.
    _, gen1, _ = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, gen1, FULL_COLLECTION_EVERY)


async def _stop(
    grace: float,
    server: grpc.aio.Server,
    health: Any,
    service: Service,
    auth: ServerAuth,
    name: str,
) -> None:
    """Stop the gRPC server, then the service, within `grace` (and a backstop after it)."""
    # Backstop: a dependency that swallows cancellation (a NATS drain with the server gone,
    # say) must not keep the process alive past its grace period.
    backstop = threading.Timer(grace + 3.0, _force_exit, args=(name,))
    backstop.daemon = True
    backstop.start()
    try:
        async with asyncio.timeout(grace + 1.0):
            # The server first: it takes no new calls and lets those under way finish while
            # everything they use is still open; stopped first, the service would fail them
            # (a closed store) or leave them hanging until the grace ran out.
            await stop_server(server, health, grace)
            await service.stop()
            if auth.audit is not None:
                await auth.audit.close()
    except TimeoutError:
        log.warning("service_stop_timeout", extra={"service": name})
    # Stopped in time: whatever runs `serve` (a test, an embedding) goes on living.
    backstop.cancel()
    log.info("service_stopped", extra={"service": name})


def server_auth(settings: ServiceSettings, local_tokens: TokenResolver | None) -> ServerAuth:
    """The doors of a service's gRPC server. Tenant admin tokens are resolved by the service
    that keeps them (`local_tokens`: the session service) or through it, cached."""
    tokens = local_tokens
    if tokens is None and settings.admin_auth == "token":
        from services.common.rpc.token_resolution import TokenClient

        tokens = CachedTokenResolver(
            TokenClient(settings.session_addr).resolve, settings.admin_token_cache_s
        )
    return ServerAuth(
        mesh_secret=settings.mesh_secret.get_secret_value()
        if settings.mesh_auth == "secret"
        else None,
        admin_token=settings.admin_token.get_secret_value(),
        admin_disabled=settings.admin_auth == "disabled",
        tokens=tokens,
        audit=AuditLog(lambda: open_audit_store(settings)),
    )


def _force_exit(name: str) -> None:
    log.error("service_stop_forced", extra={"service": name})
    logging.shutdown()
    os._exit(1)


def run_service(
    name: str, settings_cls: type[S], factory: Callable[[S], Service], argv: list[str] | None = None
) -> int:
    """Entry point of `python -m services.<name>` and `starling serve <name>`."""
    try:
        settings = load_settings(settings_cls)
    except ConfigError as exc:
        print(f"starling {name}: {exc}", file=sys.stderr)
        return 2
    register_secrets(settings.secret_values())
    set_mesh_secret(settings.mesh_secret.get_secret_value())
    setup_logging(name, settings.node_id, settings.log_level, settings.log_file)
    telemetry = setup_telemetry(
        name,
        settings.node_id,
        metrics_port=settings.metrics_port,
        metrics_host=settings.metrics_host,
        otlp_endpoint=settings.otlp_endpoint,
        sample_ratio=settings.trace_sample_ratio,
        sample_tenants=settings.trace_sample_tenants,
        trace_file_dir=settings.trace_file_dir,
    )
    log.info(
        "service_config",
        extra={
            "service": name,
            "config": settings.redacted(),
            "metrics_port": telemetry.metrics_port,
        },
    )
    try:
        service = factory(settings)
    except ConfigError as exc:
        print(f"starling {name}: {exc}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(serve(settings, service, name))
    except Exception as exc:  # start-up failure: already logged
        print(f"starling {name}: failed: {exc}", file=sys.stderr)
        return 1
    return 0
