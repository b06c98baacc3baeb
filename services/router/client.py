"""Typed client of the router service (used by connection nodes and the session service)."""

from __future__ import annotations

from services.common.rpc.server import LazyStub
from starling.common.v1.message_pb2 import RoutedMessage
from starling.router.v1 import router_pb2 as pb
from starling.router.v1 import router_pb2_grpc as pb_grpc


class RouterClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._lazy = LazyStub(address, pb_grpc.RouterServiceStub)
        self._timeout = timeout_s

    async def route(self, messages: list[RoutedMessage]) -> list[int]:
        resp = await self._lazy.stub.RoutePersistent(
            pb.RoutePersistentRequest(messages=messages), timeout=self._timeout
        )
        return list(resp.results)

    async def subscribe(
        self, tenant: str, client_id: str, incarnation: int, subs: list[pb.PersistentSubscription]
    ) -> None:
        await self._lazy.stub.Subscribe(
            pb.SubscribeRequest(
                tenant=tenant, client_id=client_id, incarnation=incarnation, subscriptions=subs
            ),
            timeout=self._timeout,
        )

    async def unsubscribe(
        self, tenant: str, client_id: str, incarnation: int, filters: list[str]
    ) -> None:
        await self._lazy.stub.Unsubscribe(
            pb.UnsubscribeRequest(
                tenant=tenant, client_id=client_id, incarnation=incarnation, topic_filters=filters
            ),
            timeout=self._timeout,
        )

    async def drop_session(self, tenant: str, client_id: str, incarnation: int) -> None:
        await self._lazy.stub.DropSession(
            pb.DropSessionRequest(tenant=tenant, client_id=client_id, incarnation=incarnation),
            timeout=self._timeout,
        )

    async def get_retained(
        self,
        tenant: str,
        topic_filter: str,
        queue_id: str = "",
        qos: int = 0,
        subscription_identifier: int = 0,
    ) -> list[RoutedMessage]:
        resp = await self._lazy.stub.GetRetained(
            pb.GetRetainedRequest(
                tenant=tenant,
                topic_filter=topic_filter,
                queue_id=queue_id,
                qos=qos,
                subscription_identifier=subscription_identifier,
            ),
            timeout=self._timeout,
        )
        return list(resp.messages)

    async def settle_will(self, tenant: str, client_id: str, publish_now: bool) -> bool:
        resp = await self._lazy.stub.SettleWill(
            pb.SettleWillRequest(tenant=tenant, client_id=client_id, publish_now=publish_now),
            timeout=self._timeout,
        )
        return bool(resp.found)

    async def close(self) -> None:
        await self._lazy.close()
