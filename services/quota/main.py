"""Composition root of the quota service: the only place that reads the environment."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from redis.asyncio import Redis

from services.common.runtime import run_service
from services.quota.api import QuotaAdminApi, QuotaApi
from services.quota.config import QuotaSettings
from starling.quota.v1 import quota_pb2 as pb
from starling.quota.v1 import quota_pb2_grpc as pb_grpc


class QuotaService:
    def __init__(self, settings: QuotaSettings) -> None:
        self._settings = settings
        self._redis = Redis.from_url(
            settings.redis_url, password=settings.redis_password.get_secret_value() or None
        )

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_QuotaServiceServicer_to_server(
            QuotaApi(self._redis, self._settings.lease_ttl_ms), server
        )
        pb_grpc.add_QuotaAdminServiceServicer_to_server(QuotaAdminApi(self._redis), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        await self._redis.ping()  # type: ignore[misc]

    async def stop(self) -> None:
        await self._redis.aclose()


def main() -> int:
    return run_service("quota", QuotaSettings, QuotaService)
