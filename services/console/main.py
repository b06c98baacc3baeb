"""Composition root of the web console: the only place that reads the environment.

The console is a service of the mesh like the others: `run_service` gives it gRPC health
(SERVING once its HTTP server listens), logging and shutdown; its pages are served by aiohttp
on `console_port`. It reaches other services only through their admin clients
(services/console/backends.py) and keeps its sessions in Redis and its audit log in the
store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc
from aiohttp import web

from services.common.dependencies import redis_ready
from services.common.forwarded import TrustedProxies
from services.common.redis_client import redis_client
from services.common.rpc.credentials import set_audited_by
from services.common.runtime import run_service
from services.common.store.open import open_audit_store
from services.console.app import build_app
from services.console.audit import Auditor
from services.console.backends import Addresses, Backends
from services.console.config import ConsoleSettings
from services.console.drains import Drains
from services.console.history import History
from services.console.instances import Directory, from_settings
from services.console.sampler import Sampler
from services.console.signin import Sessions
from services.console.web import Console
from services.metrics.client import MetricsAdminClient
from services.session.token_client import TokenClient

log = logging.getLogger("starling.console")


class ConsoleService:
    def __init__(self, settings: ConsoleSettings) -> None:
        s = settings
        self._settings = s
        set_audited_by("console")  # it records its own changes (services/common/rpc/audit.py)
        self._redis = redis_client(s)
        self._store = open_audit_store(s)
        self._tokens = TokenClient(s.session_addr)
        self._backends = Backends(
            Addresses(
                session=s.session_addr,
                router=s.router_addr,
                rules=s.rules_addr,
                quota=s.quota_addr,
                metrics=s.metrics_addr,
            )
        )
        history = History(redis=self._redis, span_s=s.console_history_s)
        directory = _directory(s)
        operator_token = s.admin_token.get_secret_value()
        self._metrics = MetricsAdminClient(s.metrics_addr, operator_token)
        self._sampler = Sampler(
            history=history,
            metrics=self._metrics,
            directory=directory,
            operator_token=operator_token,
            interval_s=s.console_sample_interval_s,
        )
        self._console = Console(
            sessions=Sessions(
                redis=self._redis,
                tokens=self._tokens,
                operator_token=s.admin_token.get_secret_value(),
                ttl_s=s.console_session_ttl_s,
                attempts_per_minute=s.console_sign_in_attempts_per_minute,
            ),
            backends=self._backends,
            auditor=Auditor(self._store),
            trusted=TrustedProxies.parse(s.console_trusted_proxies),
            page_size=s.console_page_size,
            cookie_secure=s.console_cookie_secure,
            history=history,
            directory=directory,
            drains=Drains(redis=self._redis),
        )
        self._runner: web.AppRunner | None = None
        self._sampling: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        return []  # health only

    async def start(self) -> None:
        s = self._settings
        await redis_ready(self._redis, s.dependency_wait_s)
        self._runner = web.AppRunner(build_app(self._console), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.console_host, s.console_port)
        await site.start()
        self._sampling = asyncio.create_task(self._sampler.run(), name="console-sampler")
        log.info("console_listening", extra={"host": s.console_host, "port": s.console_port})

    async def stop(self) -> None:
        if self._sampling is not None:
            self._sampling.cancel()
            await asyncio.gather(self._sampling, return_exceptions=True)
        await self._metrics.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self._backends.close()
        await self._tokens.close()
        await self._store.close()
        await self._redis.aclose()


def _directory(s: ConsoleSettings) -> Directory:
    addresses = {
        "session": s.session_addr,
        "router": s.router_addr,
        "queue": s.queue_addr,
        "rules": s.rules_addr,
        "quota": s.quota_addr,
        "metrics": s.metrics_addr,
    }
    return Directory(
        mesh_file=s.console_mesh_file,
        configured=tuple(from_settings(addresses, s.console_nodes)),
    )


def main() -> int:
    return run_service("console", ConsoleSettings, ConsoleService)
