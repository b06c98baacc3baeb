"""Thin gRPC servicers of the router service."""

from __future__ import annotations

import logging
import uuid

import grpc

from services.common.clock import now_ms
from services.common.route_table import RouteTable
from services.common.rpc.errors import InvalidArgumentError
from services.common.store.eventlog import EventKind, LogEvent, LoggedSessionStore, subscription_of
from services.common.subscription import record_from_pb, record_to_pb
from services.queue.client import NewEntry, QueueClient
from services.router.copies import TablePositions, read_snapshot_and_tail
from services.router.delaying import DelayScheduler
from services.router.fencing import RouteFence
from services.router.groups import GroupQueues
from services.router.publishing import Publisher
from services.router.retained import RetainedIndex
from services.router.retaining import Retaining
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

log = logging.getLogger("starling.router")


def _check_session(tenant: str, client_id: str, incarnation: int) -> None:
    if not tenant or not client_id or not incarnation:
        raise InvalidArgumentError("tenant, client_id and incarnation are required")


class RouterApi(pb_grpc.RouterServiceServicer):
    def __init__(
        self,
        *,
        table: RouteTable,
        store: LoggedSessionStore,
        queues: QueueClient,
        publisher: Publisher,
        retaining: Retaining,
        retained: RetainedIndex,
        scheduler: DelayScheduler,
        fence: RouteFence,
        include_qos0: bool,
        positions: TablePositions,
    ) -> None:
        self._table = table
        self._store = store
        self._positions = positions
        self._queues = queues
        self._publisher = publisher
        self._retaining = retaining
        self._retained = retained
        self._scheduler = scheduler
        self._fence = fence
        self._include_qos0 = include_qos0
        self._groups = GroupQueues(table=table, queues=queues)

    async def RoutePersistent(
        self, request: pb.RoutePersistentRequest, context: grpc.aio.ServicerContext
    ) -> pb.RoutePersistentResponse:
        for i, m in enumerate(request.messages):
            if not m.message_id:
                raise InvalidArgumentError(f"messages[{i}].message_id is required")
        results, queues = await self._publisher.accept(list(request.messages))
        return pb.RoutePersistentResponse(
            results=[pb.RouteResult.ValueType(r) for r in results], queues=queues
        )

    async def GetRetained(
        self, request: pb.GetRetainedRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRetainedResponse:
        if not request.tenant or not request.topic_filter:
            raise InvalidArgumentError("tenant and topic_filter are required")
        await self._retaining.fresh(request.tenant)
        found, examined = self._retained.match(request.tenant, request.topic_filter, now_ms())
        messages = []
        for _topic, value in found:
            m = RoutedMessage.FromString(value.data)
            m.retain = True
            messages.append(m)
        if not request.queue_id:
            return pb.GetRetainedResponse(messages=messages, examined=examined)
        sid = request.subscription_identifier
        for m in messages:  # a retained copy per subscription: its own message id
            m.message_id = f"{m.message_id}/r{uuid.uuid4().hex[:12]}"
        entries = [
            NewEntry(request.queue_id, m, min(m.qos, request.qos), True, (sid,) if sid else ())
            for m in messages
        ]
        if entries:
            await self._queues.append(request.tenant, entries)
        return pb.GetRetainedResponse(examined=examined)

    async def SettleWill(
        self, request: pb.SettleWillRequest, context: grpc.aio.ServicerContext
    ) -> pb.SettleWillResponse:
        if not request.tenant or not request.client_id:
            raise InvalidArgumentError("tenant and client_id are required")
        found = await self._scheduler.settle_will(
            request.tenant, request.client_id, request.publish_now
        )
        return pb.SettleWillResponse(found=found)

    async def Subscribe(
        self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubscribeResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        recs = [
            record_from_pb(request.tenant, request.client_id, request.incarnation, s)
            for s in request.subscriptions
        ]
        async with self._fence.change(request.tenant) as change:
            position = await self._store.put_subscriptions(recs)
            self._positions.logged(request.tenant, position)
            for r in recs:
                self._table.add(r)
            change.added.extend(
                pb.RouteEntry(
                    client_id=request.client_id, incarnation=request.incarnation, subscription=s
                )
                for s in request.subscriptions
            )
        return pb.SubscribeResponse()

    async def Unsubscribe(
        self, request: pb.UnsubscribeRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnsubscribeResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        filters = list(request.topic_filters)
        async with self._fence.change(request.tenant) as change:
            position = await self._store.delete_subscriptions(
                request.tenant, request.client_id, request.incarnation, filters
            )
            self._positions.logged(request.tenant, position)
            for f in filters:
                self._table.remove(request.tenant, request.client_id, request.incarnation, f)
                change.removed.add(
                    client_id=request.client_id, incarnation=request.incarnation
                ).subscription.topic_filter = f
        await self._groups.drop_emptied(request.tenant, filters)
        return pb.UnsubscribeResponse()

    async def ListSubscriptions(
        self, request: pb.ListSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        recs = self._table.subscriptions(request.tenant, request.client_id, request.incarnation)
        return pb.ListSubscriptionsResponse(subscriptions=[record_to_pb(r) for r in recs])

    async def DropSession(
        self, request: pb.DropSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DropSessionResponse:
        _check_session(request.tenant, request.client_id, request.incarnation)
        shared = self._groups.shared_filters(request.tenant, request.client_id, request.incarnation)
        async with self._fence.change(request.tenant) as change:
            position = await self._store.drop_subscriptions(
                request.tenant, request.client_id, request.incarnation
            )
            self._positions.logged(request.tenant, position)
            self._table.drop(request.tenant, request.client_id, request.incarnation)
            change.dropped.add(client_id=request.client_id, incarnation=request.incarnation)
        await self._groups.drop_emptied(request.tenant, shared)
        return pb.DropSessionResponse()

    async def DurableGroups(
        self, request: pb.DurableGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DurableGroupsResponse:
        durable = self._groups.durable(request.tenant, request.topic_filters)
        return pb.DurableGroupsResponse(durable=durable)

    async def RouteSnapshot(
        self, request: pb.RouteSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.RouteSnapshotResponse:
        tenant = request.tenant
        if not tenant:
            raise InvalidArgumentError("tenant is required")
        await self._fence.ensure_fenced(tenant, request.refused_version)
        async with self._fence.steady(tenant):  # the version, count and position of one table
            version = self._fence.version(tenant)
            count = self._table.count(tenant)
            position = self._positions.of(tenant)
        limit = request.max_subscriptions
        if limit and count > limit:
            return pb.RouteSnapshotResponse(version=version, too_large=True)
        if request.from_snapshot:
            found = await read_snapshot_and_tail(self._store, tenant, position, count)
            if found is not None:
                return pb.RouteSnapshotResponse(
                    version=version,
                    include_qos0=self._include_qos0,
                    from_snapshot=True,
                    snapshot_parts=found.parts,
                    tail=[_route_event(e) for e in found.tail],
                )
        async with self._fence.steady(tenant):  # entries as of one version
            version = self._fence.version(tenant)
            entries = [
                pb.RouteEntry(
                    client_id=r.client_id, incarnation=r.incarnation, subscription=record_to_pb(r)
                )
                for r in self._table.records(tenant)
            ]
        return pb.RouteSnapshotResponse(
            version=version, entries=entries, include_qos0=self._include_qos0
        )


def _route_event(e: LogEvent) -> pb.RouteEvent:
    entry = pb.RouteEntry(client_id=e.client_id, incarnation=e.incarnation)
    if e.kind == EventKind.SUBSCRIBED:
        entry.subscription.CopyFrom(record_to_pb(subscription_of(e)))
        return pb.RouteEvent(added=entry)
    if e.kind == EventKind.UNSUBSCRIBED:
        entry.subscription.topic_filter = e.topic
        return pb.RouteEvent(removed=entry)
    return pb.RouteEvent(dropped=entry)
