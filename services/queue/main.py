"""Composition root of the queue service: the only place that reads the environment."""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from services.common.bus.client import LateClient, connect
from services.common.bus.unary import APPEND_SUBJECT, UnaryServer, parse
from services.common.runtime import run_service
from services.common.store.open import open_queue_store
from services.queue.api import Partitions, QueueAdminApi, QueueApi
from services.queue.config import QueueSettings
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc


class QueueService:
    def __init__(self, settings: QueueSettings) -> None:
        self._s = settings
        self._store = open_queue_store(settings)
        self._parts = Partitions(settings)
        self._nats = LateClient()
        self._api = QueueApi(self._store, self._parts, self._s, self._nats)
        self._append_server: UnaryServer | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_QueueServiceServicer_to_server(self._api, server)  # type: ignore[arg-type]
        pb_grpc.add_QueueAdminServiceServicer_to_server(QueueAdminApi(self._store), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        self._nats.nc = await connect(
            self._s.nats_url, self._s.node_id, **self._s.nats_credentials()
        )
        await self._parts.claim_all(self._store)
        # Appends come over NATS too (the persistent publish path), once partitions are ours.
        self._append_server = UnaryServer(self._nats.nc, APPEND_SUBJECT, "queue", self._append)
        await self._append_server.start()

    async def _append(self, data: bytes) -> bytes:
        resp = await self._api.Append(parse(pb.AppendRequest, data), None)  # type: ignore[arg-type]
        return resp.SerializeToString()

    async def stop(self) -> None:
        if self._append_server is not None:
            await self._append_server.stop()
        if self._nats.nc is not None:
            await self._nats.nc.drain()
        await self._store.close()


def main() -> int:
    return run_service("queue", QueueSettings, QueueService)
