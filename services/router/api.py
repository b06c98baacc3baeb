"""Thin gRPC servicers of the router service."""

from __future__ import annotations

import logging

import grpc

from services.common.rpc.status import InvalidArgumentError
from services.common.store.ports import SessionStore, SubscriptionRecord
from services.queue.client import QueueClient
from services.queue.core import queue_id
from services.router.core import RouteTable
from starling.queue.v1 import queue_pb2
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

log = logging.getLogger("starling.router")
_OK = {queue_pb2.APPEND_RESULT_OK, queue_pb2.APPEND_RESULT_QUEUE_FULL}


def _record(
    tenant: str, client_id: str, incarnation: int, s: pb.PersistentSubscription
) -> SubscriptionRecord:
    return SubscriptionRecord(
        tenant,
        client_id,
        incarnation,
        s.topic_filter,
        s.qos,
        s.no_local,
        s.retain_as_published,
        s.retain_handling,
        s.subscription_identifier,
    )


def _check_session(tenant: str, client_id: str, incarnation: int) -> None:
    if not tenant or not client_id or not incarnation:
        raise InvalidArgumentError("tenant, client_id and incarnation are required")


class RouterApi(pb_grpc.RouterServiceServicer):
    def __init__(
        self, table: RouteTable, store: SessionStore, queues: QueueClient, queue_qos0: bool
    ) -> None:
        self._table = table
        self._store = store
        self._queues = queues
        self._qos0 = queue_qos0

    async def RoutePersistent(
        self, request: pb.RoutePersistentRequest, context: grpc.aio.ServicerContext
    ) -> pb.RoutePersistentResponse:
        results = [pb.ROUTE_RESULT_NO_MATCH] * len(request.messages)
        by_tenant: dict[str, tuple[list[queue_pb2.NewEntry], list[int]]] = {}
        for i, m in enumerate(request.messages):
            if not m.message_id:
                raise InvalidArgumentError(f"messages[{i}].message_id is required")
            for t in self._table.targets(
                m.tenant, m.topic, m.qos, m.retain, m.publisher.client_id, self._qos0
            ):
                entries, owners = by_tenant.setdefault(m.tenant, ([], []))
                entries.append(
                    queue_pb2.NewEntry(
                        queue_id=queue_id(t.client_id, t.incarnation),
                        message=m,
                        qos=t.qos,
                        retain=t.retain,
                        subscription_identifiers=t.subscription_ids,
                    )
                )
                owners.append(i)
        queues = 0
        for tenant, (entries, owners) in by_tenant.items():
            try:
                outcomes = await self._queues.append(tenant, entries)
            except grpc.aio.AioRpcError as exc:
                log.warning("queue_append_failed", extra={"code": exc.code().name})
                outcomes = [queue_pb2.APPEND_RESULT_UNSPECIFIED] * len(entries)
            for i, outcome in zip(owners, outcomes, strict=True):
                if outcome not in _OK:
                    results[i] = pb.ROUTE_RESULT_TRY_LATER
                elif results[i] != pb.ROUTE_RESULT_TRY_LATER:
                    results[i] = pb.ROUTE_RESULT_STORED
            queues += len(entries)
        return pb.RoutePersistentResponse(results=results, queues=queues)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubscribeResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        recs = [
            _record(request.tenant, request.client_id, request.incarnation, s)
            for s in request.subscriptions
        ]
        await self._store.put_subscriptions(recs)
        for r in recs:
            self._table.add(r)
        return pb.SubscribeResponse()

    async def Unsubscribe(
        self, request: pb.UnsubscribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnsubscribeResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        filters = list(request.topic_filters)
        await self._store.delete_subscriptions(
            request.tenant, request.client_id, request.incarnation, filters
        )
        for f in filters:
            self._table.remove(request.tenant, request.client_id, request.incarnation, f)
        return pb.UnsubscribeResponse()

    async def ListSubscriptions(
        self, request: pb.ListSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        recs = self._table.subscriptions(request.tenant, request.client_id, request.incarnation)
        return pb.ListSubscriptionsResponse(
            subscriptions=[
                pb.PersistentSubscription(
                    topic_filter=r.topic_filter,
                    qos=r.qos,
                    no_local=r.no_local,
                    retain_as_published=r.retain_as_published,
                    retain_handling=r.retain_handling,
                    subscription_identifier=r.subscription_identifier,
                )
                for r in recs
            ]
        )

    async def DropSession(
        self, request: pb.DropSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DropSessionResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        await self._store.drop_subscriptions(request.tenant, request.client_id, request.incarnation)
        self._table.drop(request.tenant, request.client_id, request.incarnation)
        return pb.DropSessionResponse()
