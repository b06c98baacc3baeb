"""Composition root of the queue service: the only place that reads the environment."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import grpc

from services.common.bus.client import LateClient, connect, drain
from services.common.bus.unary import (
    ACK_SUBJECT,
    APPEND_SUBJECT,
    DIRECT_APPEND_SUBJECT,
    FENCE_ROUTES_SUBJECT,
    READ_SUBJECT,
    RELEASED_SUBJECT,
    UnaryServer,
    servicer_handler,
)
from services.common.runtime import run_service
from services.common.store.open import open_queue_store
from services.metrics.client import MetricsClient, TenantCounters, report_every
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
        # LateClient stands in for the NATS client until start() connects it.
        self._api = QueueApi(self._store, self._parts, self._s, self._nats)  # type: ignore[arg-type]
        self._servers: list[UnaryServer] = []
        self._reporter: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_QueueServiceServicer_to_server(self._api, server)
        pb_grpc.add_QueueAdminServiceServicer_to_server(QueueAdminApi(self._store), server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        self._nats.nc = await connect(
            self._s.nats_url, self._s.node_id, **self._s.nats_credentials()
        )
        await self._parts.claim_all(self._store)
        # The persistent path's calls come over NATS too, once the partitions are ours.
        api = self._api
        for subject, method, request, group in (
            (APPEND_SUBJECT, api.Append, pb.AppendRequest, "queue"),
            (DIRECT_APPEND_SUBJECT, api.DirectAppend, pb.AppendRequest, "queue"),
            # Every instance must learn a fenced version: no queue group.
            (FENCE_ROUTES_SUBJECT, api.FenceRoutes, pb.FenceRoutesRequest, ""),
            (READ_SUBJECT, api.Read, pb.ReadRequest, "queue"),
            (ACK_SUBJECT, api.Ack, pb.AckRequest, "queue"),
            (RELEASED_SUBJECT, api.MarkReleased, pb.MarkReleasedRequest, "queue"),
        ):
            server = UnaryServer(self._nats.nc, subject, group, servicer_handler(method, request))
            await server.start()
            self._servers.append(server)
        self._reporter = asyncio.create_task(
            report_every(
                MetricsClient(self._s.metrics_addr),
                f"queue:{self._s.node_id}",
                self._figures,
                self._s.stats_interval_s,
                kind="queue",
            )
        )

    def _figures(self) -> list[TenantCounters]:
        """This instance's drops by the depth limit, per tenant (the queues' depths are
        not counted yet: the stores keep no per-tenant total)."""
        return [
            TenantCounters(tenant=t, queue_dropped=n)
            for t, n in sorted(self._api.dropped_by_tenant.items())
        ]

    async def stop(self) -> None:
        if self._reporter is not None:
            self._reporter.cancel()
        for server in self._servers:
            await server.stop()
        if self._nats.nc is not None:
            await drain(self._nats.nc)
        await self._store.close()


def main() -> int:
    return run_service("queue", QueueSettings, QueueService)
