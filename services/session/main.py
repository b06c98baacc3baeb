"""Composition root of the session service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc
from nats.aio.client import Client
from redis.asyncio import Redis

from services.common.bus import subjects
from services.common.bus.client import LateClient, connect
from services.common.runtime import run_service
from services.common.store.open import open_auth_store, open_session_store, open_token_store
from services.queue.client import QueueClient
from services.router.client import RouterClient
from services.session.api import SessionAdminApi, SessionApi
from services.session.auth import Authenticator
from services.session.config import SessionSettings
from services.session.events import Events
from services.session.liveness import NodeLiveness
from services.session.registry import Registry
from services.session.sessions import Sessions
from services.session.token_api import TokenAdminApi, TokenApi
from services.session.tokens import AdminTokens
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import admin_tokens_pb2_grpc as tokens_grpc
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc


class SessionService:
    def __init__(self, settings: SessionSettings) -> None:
        self._settings = settings
        self._redis = Redis.from_url(
            settings.redis_url, password=settings.redis_password.get_secret_value() or None
        )
        self._store = open_auth_store(settings)
        self._session_store = open_session_store(settings)
        self._token_store = open_token_store(settings)
        # The runtime resolves tenant admin tokens through this (no remote call, no cache).
        self.admin_tokens = AdminTokens(
            self._token_store, settings.admin_token_max_ttl_s, settings.admin_tokens_per_tenant_max
        )
        self._nats = LateClient()
        nc: Client = self._nats  # type: ignore[assignment]
        self._auth = Authenticator(
            self._store, self._redis, settings.auth_cache_ttl_s, settings.anonymous_tenants
        )
        self._registry = Registry(self._redis)
        self._router = RouterClient(settings.router_addr)
        self._queues = QueueClient(settings.queue_addr)
        self._events = Events(nc, settings.node_id)
        self._sessions = Sessions(
            self._session_store,
            self._router,
            self._queues,
            settings.max_session_expiry_s,
            self._events,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._liveness = NodeLiveness(self._registry, self._sessions, settings.node_timeout_s)
        self._watcher: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        nc: Client = self._nats  # type: ignore[assignment]
        pb_grpc.add_SessionServiceServicer_to_server(
            SessionApi(
                self._auth,
                self._registry,
                nc,
                self._events,
                self._settings.acl_default == "allow",
                self._sessions,
            ),
            server,
        )
        pb_grpc.add_SessionAdminServiceServicer_to_server(
            SessionAdminApi(self._auth, self._registry, nc), server
        )
        tokens_grpc.add_TokenAdminServiceServicer_to_server(
            TokenAdminApi(self.admin_tokens), server
        )
        tokens_grpc.add_TokenServiceServicer_to_server(TokenApi(self.admin_tokens), server)
        return [
            s.full_name
            for d in (pb.DESCRIPTOR, tokens_pb.DESCRIPTOR)
            for s in d.services_by_name.values()
        ]

    async def start(self) -> None:
        await self._redis.ping()  # type: ignore[misc]
        self._nats.nc = await connect(
            self._settings.nats_url, self._settings.node_id, **self._settings.nats_credentials()
        )
        js = self._nats.nc.jetstream()
        try:
            await js.stream_info(subjects.EVENTS_STREAM)
        except Exception:
            await js.add_stream(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.EVENTS_WILDCARD],
                max_age=7 * 24 * 3600,
            )
        self._sweeper = asyncio.create_task(
            self._sessions.run_sweeper(self._settings.session_expiry_sweep_s)
        )
        await self._liveness.start(self._nats.nc)
        self._watcher = asyncio.create_task(self._liveness.run())

    async def stop(self) -> None:
        for task in (self._sweeper, self._watcher):
            if task is not None:
                task.cancel()
        await self._sessions.stop(min(2.0, self._settings.shutdown_grace_s / 2))
        await self._router.close()
        await self._queues.close()
        if self._nats.nc is not None:
            await self._nats.nc.drain()
        await self._redis.aclose()
        await self._store.close()
        await self._session_store.close()
        await self._token_store.close()


def main() -> int:
    return run_service("session", SessionSettings, SessionService)
