"""Composition root of the router service: the only place that reads the environment."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc

from services.common.runtime import run_service
from services.common.store.open import open_session_store
from services.queue.client import QueueClient
from services.router.api import RouterApi
from services.router.config import RouterSettings
from services.router.core import RouteTable
from starling.router.v1 import router_pb2_grpc as pb_grpc

log = logging.getLogger("starling.router")


class RouterService:
    def __init__(self, settings: RouterSettings) -> None:
        self._s = settings
        self._store = open_session_store(settings)
        self._table = RouteTable()
        self._queues = QueueClient(settings.queue_addr)

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_RouterServiceServicer_to_server(
            RouterApi(self._table, self._store, self._queues, self._s.queue_qos0_offline), server
        )
        return ["starling.router.v1.RouterService"]

    async def start(self) -> None:
        for rec in await self._store.all_subscriptions():
            self._table.add(rec)
        log.info("route_table_loaded", extra={"subscriptions": len(self._table)})

    async def stop(self) -> None:
        await self._queues.close()
        await self._store.close()


def main() -> int:
    return run_service("router", RouterSettings, RouterService)
