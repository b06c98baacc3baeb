"""The router's admin API: routes, retained and delayed messages per tenant."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from services.common.bus import subjects
from services.common.clock import now_ms
from services.common.mqtt.errors import MqttError
from services.common.route_table import RouteTable
from services.common.rpc.arguments import tenant_argument
from services.common.rpc.errors import InvalidArgumentError, NotFoundError
from services.common.topics import NO_LIMITS, validate_topic_filter, validate_topic_name
from services.router.delaying import DelayedMessages
from services.router.retained import RetainedIndex
from services.router.retaining import Retaining
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc


def _filter_syntax(value: str) -> None:
    # The syntax only: the nodes' own length and level limits may be above the defaults.
    validate_topic_filter(value, NO_LIMITS)


def _name_syntax(value: str) -> None:
    validate_topic_name(value, NO_LIMITS)


def _checked(what: str, value: str, check: Callable[[str], None]) -> str:
    """`value` if `check` takes it; else INVALID_ARGUMENT (`a/#/b` would match as `a/#`)."""
    try:
        check(value)
    except MqttError as exc:
        raise InvalidArgumentError(f"{what} {value[:200]!r}: {exc}") from None
    return value


class RouterAdminApi(pb_grpc.RouterAdminServiceServicer):
    def __init__(
        self,
        *,
        table: RouteTable,
        retained: RetainedIndex,
        retaining: Retaining,
        delayed: DelayedMessages,
        nats: Any = None,
    ) -> None:
        self._nats = nats
        self._table = table
        self._retained = retained
        self._retaining = retaining
        self._delayed = delayed

    async def ListRoutes(
        self, request: pb.ListRoutesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRoutesResponse:
        """Transient routes (filter -> nodes, gathered from every node over NATS) and
        persistent routes (filter -> sessions client#incarnation, from the route table)."""
        tenant = tenant_argument(request.tenant)
        nodes: dict[str, set[str]] = {}
        gathered = [] if request.persistent_only else await self._gather(tenant)
        for reply in gathered:
            for r in reply.routes:
                nodes.setdefault(r.topic_filter, set()).update(r.node_ids)
        routes = [pb.Route(topic_filter=f, node_ids=sorted(ns)) for f, ns in sorted(nodes.items())]
        routes += [
            pb.Route(topic_filter=f, node_ids=sorted(sessions), persistent=True)
            for f, sessions in sorted(self._table.routes(tenant).items())
        ]
        return pb.ListRoutesResponse(routes=routes)

    async def _gather(
        self, tenant: str, gather_s: float = 0.3, quiet_s: float = 0.05
    ) -> list[pb.ListRoutesResponse]:
        """Scatter-gather over NATS: the nodes' answers within `gather_s`, ending early once
        `quiet_s` passed without another after the first (nodes answer together; a console
        page must not wait the whole window every time)."""
        nc = self._nats
        if nc is None:
            return []
        inbox = nc.new_inbox()
        replies: list[pb.ListRoutesResponse] = []
        arrived = asyncio.Event()

        async def collect(msg: Any) -> None:
            replies.append(pb.ListRoutesResponse.FromString(msg.data))
            arrived.set()

        sub = await nc.subscribe(inbox, cb=collect)
        await nc.publish(subjects.ROUTE_LISTING, tenant.encode(), reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + gather_s
        while (left := deadline - loop.time()) > 0:
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), min(left, quiet_s) if replies else left)
            except TimeoutError:
                if replies:
                    break
        await sub.unsubscribe()
        return replies

    async def ListRetained(
        self, request: pb.ListRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRetainedResponse:
        tenant = tenant_argument(request.tenant)
        await self._retaining.fresh(tenant)
        filt = _checked("topic_filter", request.topic_filter or "#", _filter_syntax)
        found, examined = self._retained.match(tenant, filt, now_ms())
        limit = request.limit or 1000
        return pb.ListRetainedResponse(
            messages=[RoutedMessage.FromString(v.data) for _, v in found[:limit]],
            examined=examined,
            stored=self._retained.count(tenant),
        )

    async def DeleteRetained(
        self, request: pb.DeleteRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRetainedResponse:
        tenant = tenant_argument(request.tenant)
        _checked("topic", request.topic, _name_syntax)
        deleted = await self._retaining.delete(tenant, request.topic)
        return pb.DeleteRetainedResponse(deleted=deleted)

    async def ListDelayed(
        self, request: pb.ListDelayedRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDelayedResponse:
        tenant = tenant_argument(request.tenant)
        await self._delayed.fresh()
        recs = self._delayed.of_tenant(tenant)
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
        tenant = tenant_argument(request.tenant)
        if not await self._delayed.cancel(tenant, request.id):
            raise NotFoundError(f"no delayed message {request.id!r} in {tenant!r}")
        return pb.CancelDelayedResponse(cancelled=True)
