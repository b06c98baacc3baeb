"""Composition root of the session service: the only place that reads the environment."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from nats.aio.client import Client
from redis.asyncio import Redis

from services.common.bus import subjects
from services.common.bus.client import connect
from services.common.runtime import run_service
from services.common.store.ports import AuthStore
from services.common.store.sqlite import SqliteStore
from services.session.api import Events, SessionAdminApi, SessionApi
from services.session.auth import Authenticator
from services.session.config import SessionSettings
from services.session.registry import Registry
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc


def open_store(settings: SessionSettings) -> AuthStore:
    if settings.cassandra_contact_points:
        from services.common.store.cassandra import CassandraStore

        return CassandraStore(
            settings.cassandra_contact_points,
            settings.cassandra_port,
            settings.cassandra_keyspace,
            consistency=settings.cassandra_consistency,
        )
    return SqliteStore(settings.data_dir / "starling.db")


class _LateNats:
    """Forwards to the NATS client once `start` connected it (servicers are built earlier)."""

    def __init__(self) -> None:
        self.nc: Client | None = None

    def __getattr__(self, name: str) -> object:
        if self.nc is None:
            raise RuntimeError("NATS is not connected yet")
        return getattr(self.nc, name)


class SessionService:
    def __init__(self, settings: SessionSettings) -> None:
        self._settings = settings
        self._redis = Redis.from_url(settings.redis_url)
        self._store = open_store(settings)
        self._nats = _LateNats()
        self._auth = Authenticator(
            self._store, self._redis, settings.auth_cache_ttl_s, settings.anonymous_tenants
        )
        self._registry = Registry(self._redis)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        nc: Client = self._nats  # type: ignore[assignment]
        events = Events(nc, self._settings.node_id)
        pb_grpc.add_SessionServiceServicer_to_server(
            SessionApi(
                self._auth, self._registry, nc, events, self._settings.acl_default == "allow"
            ),
            server,
        )
        pb_grpc.add_SessionAdminServiceServicer_to_server(
            SessionAdminApi(self._auth, self._registry, nc), server
        )
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        await self._redis.ping()  # type: ignore[misc]
        self._nats.nc = await connect(self._settings.nats_url, self._settings.node_id)
        js = self._nats.nc.jetstream()
        try:
            await js.stream_info(subjects.EVENTS_STREAM)
        except Exception:
            await js.add_stream(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.EVENTS_WILDCARD],
                max_age=7 * 24 * 3600,
            )

    async def stop(self) -> None:
        if self._nats.nc is not None:
            await self._nats.nc.drain()
        await self._redis.aclose()
        await self._store.close()


def main() -> int:
    return run_service("session", SessionSettings, SessionService)
