"""The router's admin API: routes, retained and delayed messages per tenant."""

from __future__ import annotations

import time

import grpc

from services.common.rpc.status import InvalidArgumentError, NotFoundError
from services.router.core import RouteTable
from services.router.publishing import Publisher
from services.router.retained import RetainedIndex
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc


def _tenant(value: str) -> str:
    if not value:
        raise InvalidArgumentError("tenant is required")
    return value


class RouterAdminApi(pb_grpc.RouterAdminServiceServicer):
    def __init__(
        self, table: RouteTable, retained: RetainedIndex, publisher: Publisher, store: object
    ) -> None:
        self._table = table
        self._retained = retained
        self._publisher = publisher
        self._store = store

    async def ListRoutes(
        self, request: pb.ListRoutesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRoutesResponse:
        routes = self._table.routes(_tenant(request.tenant))
        return pb.ListRoutesResponse(
            routes=[
                pb.Route(topic_filter=f, node_ids=sorted(sessions), persistent=True)
                for f, sessions in sorted(routes.items())
            ]
        )

    async def ListRetained(
        self, request: pb.ListRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRetainedResponse:
        tenant = _tenant(request.tenant)
        found, examined = self._retained.match(
            tenant, request.topic_filter or "#", int(time.time() * 1000)
        )
        limit = request.limit or 1000
        return pb.ListRetainedResponse(
            messages=[RoutedMessage.FromString(v.data) for _, v in found[:limit]],
            examined=examined,
            stored=self._retained.count(tenant),
        )

    async def DeleteRetained(
        self, request: pb.DeleteRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRetainedResponse:
        tenant = _tenant(request.tenant)
        deleted = self._retained.delete(tenant, request.topic)
        await self._store.delete_retained(tenant, request.topic)  # type: ignore[attr-defined]
        return pb.DeleteRetainedResponse(deleted=deleted)

    async def ListDelayed(
        self, request: pb.ListDelayedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDelayedResponse:
        tenant = _tenant(request.tenant)
        recs = sorted(
            (r for (t, _), r in self._publisher.delayed.items() if t == tenant),
            key=lambda r: r.due_ms,
        )
        return pb.ListDelayedResponse(
            messages=[
                pb.DelayedMessage(
                    id=r.id, due_ms=r.due_ms, message=RoutedMessage.FromString(r.data)
                )
                for r in recs
            ]
        )

    async def CancelDelayed(
        self, request: pb.CancelDelayedRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelDelayedResponse:
        tenant = _tenant(request.tenant)
        if not await self._publisher.cancel(tenant, request.id):
            raise NotFoundError(f"no delayed message {request.id!r} in {tenant!r}")
        return pb.CancelDelayedResponse(cancelled=True)
