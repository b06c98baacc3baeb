"""Composition root of the quota service: the only place that reads the environment."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc
from nats.aio.client import Client

from services.common.bus.client import connect, drain
from services.common.bus.flushing import flushed
from services.common.dependencies import redis_ready
from services.common.redis_client import redis_client
from services.common.runtime import run_service
from services.common.store.open import open_ban_store
from services.quota.api import Bans, QuotaAdminApi, QuotaApi
from services.quota.config import QuotaSettings
from services.quota.key_migration import migrate_limit_keys
from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc

log = logging.getLogger("starling.quota")


class QuotaService:
    def __init__(self, settings: QuotaSettings) -> None:
        self._settings = settings
        self._redis = redis_client(settings)
        # The store, not Redis: a Redis flush loses no ban; Cassandra when configured, so
        # every quota instance of the cluster holds one list.
        self._store = open_ban_store(settings)
        self._nc: Client | None = None
        self._bans = Bans(self._store, self._publish, settings.max_bans)

    async def _publish(self, subject: str, data: bytes) -> None:
        """Announce a change; without NATS, holders learn it at their next sync."""
        if self._nc is not None and self._nc.is_connected:
            await self._nc.publish(subject, data)
            await flushed(self._nc, 2)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_QuotaServiceServicer_to_server(
            QuotaApi(
                self._redis,
                self._settings.lease_ttl_ms,
                self._bans,
                self._settings.share_horizon_s,
            ),
            server,
        )
        pb_grpc.add_QuotaAdminServiceServicer_to_server(
            QuotaAdminApi(self._redis, self._bans, self._publish), server
        )
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        await redis_ready(self._redis, self._settings.dependency_wait_s)
        await migrate_limit_keys(self._redis)
        s = self._settings
        self._nc = await connect(s.nats_url, s.node_id, **s.nats_options())

    async def stop(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await drain(self._nc)
        await self._store.close()
        await self._redis.aclose()


def main() -> int:
    return run_service("quota", QuotaSettings, QuotaService)
