"""Typed clients of the router service: `RouterClient` for connection nodes and the session
service, `RouterAdminClient` for operators (the CLI).

Publishes travel as `RoutedMessage` envelopes (what NATS carries too); everything else goes in
and comes out as domain values: results as `RouteResult`, retained messages as `Message`,
subscriptions as `IdentifiedSubscription`. Failures raise services/common/rpc/errors.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client

from services.common.bus import unary
from services.common.bus.unary import UnaryClient
from services.common.connect import IdentifiedSubscription
from services.common.envelope import from_envelope
from services.common.gcpause import gc_paused
from services.common.message import Message
from services.common.route_table import RouteResult, RouteTable
from services.common.rpc.client import LazyStub, target
from services.common.rpc.limits import split_by_bytes
from services.common.store.ports_session import SubscriptionRecord
from services.common.subscription import identified_from_pb, identified_to_pb, record_from_pb
from services.router.snapshot import load_tenant
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc

__all__ = [
    "DelayedMessage",
    "RetainedListing",
    "Route",
    "RouteResult",
    "RouteSnapshot",
    "RouterAdminClient",
    "RouterClient",
]

_RESULTS = {int(r): r for r in RouteResult}
# Several router instances: a routed batch not answered within this is sent again (a killed
# instance never answers, and NATS cannot tell a dead responder from a slow one); the same
# message ids, so a repeat stores nothing twice. One instance: the call's own timeout.
FAIL_OVER_S = 1.0


def _result(value: int) -> RouteResult:
    # A reply the router never sends (UNSPECIFIED): not stored, so the node keeps it.
    return _RESULTS.get(value, RouteResult.TRY_LATER)


class RouterClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.RouterServiceStub, timeout_s=timeout_s)
        self._timeout_s = timeout_s
        self._bus: UnaryClient | None = None
        self._route_timeout_s = FAIL_OVER_S if target(address)[1] else timeout_s
        self._route_bus: UnaryClient | None = None

    def use_bus(self, nc: Client) -> None:
        """Send `route` and `settle_will` over NATS request/reply from now on (gRPC for what
        does not fit one NATS message): services/common/bus/unary.py says why."""
        self._bus = UnaryClient(nc, self._timeout_s)
        self._route_bus = UnaryClient(nc, self._route_timeout_s)

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        """Store QoS>=1 publishes for persistent sessions; one result per message, in order.

        Sent in calls of at most BATCH_BYTES (a larger message alone), one after the other,
        so no call exceeds the gRPC message limit (services/common/rpc/limits.py)."""
        results: list[RouteResult] = []
        for run in split_by_bytes(messages, RoutedMessage.ByteSize):
            req = pb.RoutePersistentRequest(messages=run)
            resp = await unary.call(
                self._route_bus,
                unary.ROUTE_SUBJECT,
                self._rpc,
                self._rpc.stub.RoutePersistent,
                req,
                pb.RoutePersistentResponse,
            )
            results += [_result(r) for r in resp.results]
        return results

    async def subscribe(
        self,
        tenant: str,
        client_id: str,
        incarnation: int,
        subscriptions: Sequence[IdentifiedSubscription],
    ) -> None:
        """Add (or replace, per filter) a persistent session's subscriptions."""
        req = pb.SubscribeRequest(
            tenant=tenant,
            client_id=client_id,
            incarnation=incarnation,
            subscriptions=[identified_to_pb(s, i) for s, i in subscriptions],
        )
        await self._rpc.call(self._rpc.stub.Subscribe, req)

    async def unsubscribe(
        self, tenant: str, client_id: str, incarnation: int, filters: Sequence[str]
    ) -> None:
        req = pb.UnsubscribeRequest(
            tenant=tenant, client_id=client_id, incarnation=incarnation, topic_filters=filters
        )
        await self._rpc.call(self._rpc.stub.Unsubscribe, req)

    async def subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[IdentifiedSubscription]:
        """A persistent session's subscriptions as the route table holds them."""
        req = pb.ListSubscriptionsRequest(
            tenant=tenant, client_id=client_id, incarnation=incarnation
        )
        resp = await self._rpc.call(self._rpc.stub.ListSubscriptions, req)
        return [identified_from_pb(s) for s in resp.subscriptions]

    async def durable_groups(self, tenant: str, filters: Sequence[str]) -> list[bool]:
        """Which shared filters (`$share/...`) are durable groups' (they own a queue)."""
        req = pb.DurableGroupsRequest(tenant=tenant, topic_filters=filters)
        resp = await self._rpc.call(self._rpc.stub.DurableGroups, req)
        return list(resp.durable)

    async def drop_session(self, tenant: str, client_id: str, incarnation: int) -> None:
        """Forget every subscription of one session incarnation (it ended or expired)."""
        req = pb.DropSessionRequest(tenant=tenant, client_id=client_id, incarnation=incarnation)
        await self._rpc.call(self._rpc.stub.DropSession, req)

    async def retained(self, tenant: str, topic_filter: str) -> list[Message]:
        """Retained messages matching a new subscription's filter (retain flag set)."""
        req = pb.GetRetainedRequest(tenant=tenant, topic_filter=topic_filter)
        resp = await self._rpc.call(self._rpc.stub.GetRetained, req)
        return [from_envelope(m) for m in resp.messages]

    async def queue_retained(
        self,
        tenant: str,
        topic_filter: str,
        queue_id: str,
        qos: int,
        subscription_id: int | None,
    ) -> None:
        """A persistent session's new subscription: the router appends the matching retained
        messages to its queue at min(message QoS, `qos`); the node reads them from there."""
        req = pb.GetRetainedRequest(
            tenant=tenant,
            topic_filter=topic_filter,
            queue_id=queue_id,
            qos=qos,
            subscription_identifier=subscription_id or 0,
        )
        await self._rpc.call(self._rpc.stub.GetRetained, req)

    async def settle_will(self, tenant: str, client_id: str, publish_now: bool) -> bool:
        """The client is back: cancel its delayed will, or publish it now (the old session
        ended) [MQTT-3.1.3-9]. False: it had none."""
        req = pb.SettleWillRequest(tenant=tenant, client_id=client_id, publish_now=publish_now)
        resp = await unary.call(
            self._bus,
            unary.SETTLE_WILL_SUBJECT,
            self._rpc,
            self._rpc.stub.SettleWill,
            req,
            pb.SettleWillResponse,
        )
        return bool(resp.found)

    async def route_snapshot(
        self,
        tenant: str,
        max_subscriptions: int,
        refused_version: int = 0,
        from_snapshot: bool = True,
    ) -> RouteSnapshot:
        """The tenant's persistent route table as of one version, for a node's copy
        (services/connection/replica.py); `refused_version`: a queue refused the copy at
        that version. `from_snapshot`: let the router send its routing snapshot and the
        log after it (loaded here without per-subscription work) instead of every entry."""
        req = pb.RouteSnapshotRequest(
            tenant=tenant,
            max_subscriptions=max_subscriptions,
            refused_version=refused_version,
            from_snapshot=from_snapshot,
        )
        resp = await self._rpc.call(self._rpc.stub.RouteSnapshot, req)
        table = RouteTable()
        with gc_paused():  # (see services/common/gcpause.py)
            if resp.from_snapshot:
                if resp.snapshot_parts:
                    load_tenant(table, tenant, list(resp.snapshot_parts))
                for e in resp.tail:
                    apply_route_event(table, tenant, e)
            else:
                for entry in resp.entries:
                    table.add(route_record(tenant, entry))
        return RouteSnapshot(
            resp.version,
            table,
            resp.include_qos0,
            resp.too_large,
            resp.from_snapshot,
            len(resp.tail),
        )

    async def close(self) -> None:
        await self._rpc.close()


def route_record(tenant: str, e: pb.RouteEntry) -> SubscriptionRecord:
    return record_from_pb(tenant, e.client_id, e.incarnation, e.subscription)


def apply_route_event(table: RouteTable, tenant: str, e: pb.RouteEvent) -> None:
    """One logged change (a snapshot's tail) onto a table."""
    which = e.WhichOneof("change")
    if which == "added":
        table.add(route_record(tenant, e.added))
    elif which == "removed":
        r = e.removed
        table.remove(tenant, r.client_id, r.incarnation, r.subscription.topic_filter)
    elif which == "dropped":
        table.drop(tenant, e.dropped.client_id, e.dropped.incarnation)


@dataclass(frozen=True, slots=True)
class RouteSnapshot:
    version: int
    table: RouteTable  # the tenant's table at `version` (empty when too_large)
    include_qos0: bool  # QoS 0 subscriptions get queue entries too (router setting)
    too_large: bool  # more than asked for: none sent
    from_snapshot: bool  # loaded from the routing snapshot and the log after it
    replayed: int = 0  # log events after the snapshot's checkpoint applied


@dataclass(frozen=True, slots=True)
class Route:
    topic_filter: str
    # Transient routes: the nodes holding the filter; persistent: sessions (client#incarnation).
    node_ids: tuple[str, ...]
    persistent: bool


@dataclass(frozen=True, slots=True)
class RetainedListing:
    messages: tuple[Message, ...]
    examined: int  # index nodes read to answer (cost of the lookup)
    stored: int  # retained messages stored for the tenant


@dataclass(frozen=True, slots=True)
class DelayedMessage:
    id: str
    due_ms: int
    message: Message


class RouterAdminClient:
    """Routes, retained and delayed messages per tenant (the admin token is required)."""

    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.RouterAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def list_routes(self, tenant: str, persistent_only: bool = False) -> list[Route]:
        """Transient filters with their nodes, then persistent ones with their sessions
        (`persistent_only`: those alone, without asking the nodes)."""
        req = pb.ListRoutesRequest(tenant=tenant, persistent_only=persistent_only)
        resp = await self._rpc.call(self._rpc.stub.ListRoutes, req)
        return [Route(r.topic_filter, tuple(r.node_ids), r.persistent) for r in resp.routes]

    async def list_retained(
        self, tenant: str, topic_filter: str = "#", limit: int = 100
    ) -> RetainedListing:
        req = pb.ListRetainedRequest(tenant=tenant, topic_filter=topic_filter, limit=limit)
        resp = await self._rpc.call(self._rpc.stub.ListRetained, req)
        return RetainedListing(
            tuple(from_envelope(m) for m in resp.messages), resp.examined, resp.stored
        )

    async def delete_retained(self, tenant: str, topic: str) -> bool:
        req = pb.DeleteRetainedRequest(tenant=tenant, topic=topic)
        resp = await self._rpc.call(self._rpc.stub.DeleteRetained, req)
        return bool(resp.deleted)

    async def list_delayed(self, tenant: str) -> list[DelayedMessage]:
        """Delayed publishes and wills, soonest first."""
        req = pb.ListDelayedRequest(tenant=tenant)
        resp = await self._rpc.call(self._rpc.stub.ListDelayed, req)
        return [DelayedMessage(d.id, d.due_ms, from_envelope(d.message)) for d in resp.messages]

    async def cancel_delayed(self, tenant: str, id: str) -> None:
        """Raises `NotFoundError` when it was already published or cancelled."""
        req = pb.CancelDelayedRequest(tenant=tenant, id=id)
        await self._rpc.call(self._rpc.stub.CancelDelayed, req)

    async def close(self) -> None:
        await self._rpc.close()
