"""Thin gRPC servicers of the router service."""

from __future__ import annotations

import logging
import time
import uuid

import grpc

from services.common.rpc.status import InvalidArgumentError
from services.common.store.ports import SessionStore, SubscriptionRecord
from services.queue.client import QueueClient
from services.router.core import RouteTable
from services.router.publishing import Publisher
from services.router.retained import RetainedIndex
from starling.common.v1.message_pb2 import RoutedMessage
from starling.queue.v1 import queue_pb2
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

log = logging.getLogger("starling.router")


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
        self,
        table: RouteTable,
        store: SessionStore,
        queues: QueueClient,
        publisher: Publisher,
        retained: RetainedIndex,
    ) -> None:
        self._table = table
        self._store = store
        self._queues = queues
        self._publisher = publisher
        self._retained = retained

    async def RoutePersistent(
        self, request: pb.RoutePersistentRequest, context: grpc.aio.ServicerContext
    ) -> pb.RoutePersistentResponse:
        for i, m in enumerate(request.messages):
            if not m.message_id:
                raise InvalidArgumentError(f"messages[{i}].message_id is required")
        results, queues = await self._publisher.accept(list(request.messages))
        return pb.RoutePersistentResponse(results=results, queues=queues)

    async def GetRetained(
        self, request: pb.GetRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRetainedResponse:
        if not request.tenant or not request.topic_filter:
            raise InvalidArgumentError("tenant and topic_filter are required")
        found, examined = self._retained.match(
            request.tenant, request.topic_filter, int(time.time() * 1000)
        )
        messages = []
        for _topic, value in found:
            m = RoutedMessage.FromString(value.data)
            m.retain = True
            messages.append(m)
        if not request.queue_id:
            return pb.GetRetainedResponse(messages=messages, examined=examined)
        entries = [
            queue_pb2.NewEntry(
                queue_id=request.queue_id,
                message=m,
                qos=min(m.qos, request.qos),
                retain=True,
                subscription_identifiers=(
                    [request.subscription_identifier] if request.subscription_identifier else []
                ),
            )
            for m in messages
        ]
        for e in entries:  # a retained copy per subscription: its own message id
            e.message.message_id = f"{e.message.message_id}/r{uuid.uuid4().hex[:12]}"
        if entries:
            await self._queues.append(request.tenant, entries)
        return pb.GetRetainedResponse(examined=examined)

    async def SettleWill(
        self, request: pb.SettleWillRequest, context: grpc.aio.ServicerContext
    ) -> pb.SettleWillResponse:
        if not request.tenant or not request.client_id:
            raise InvalidArgumentError("tenant and client_id are required")
        found = await self._publisher.settle_will(
            request.tenant, request.client_id, request.publish_now
        )
        return pb.SettleWillResponse(found=found)

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
