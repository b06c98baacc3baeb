"""Typed client of the queue service (used by the router, the session service and nodes)."""

from __future__ import annotations

from services.common.rpc.server import LazyStub
from services.queue.core import queue_id

__all__ = ["QueueClient", "queue_id"]
from starling.queue.v1 import queue_pb2 as pb
from starling.queue.v1 import queue_pb2_grpc as pb_grpc


class QueueClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._lazy = LazyStub(address, pb_grpc.QueueServiceStub)
        self._timeout = timeout_s

    async def append(self, tenant: str, entries: list[pb.NewEntry]) -> list[int]:
        resp = await self._lazy.stub.Append(
            pb.AppendRequest(tenant=tenant, entries=entries), timeout=self._timeout
        )
        return list(resp.results)

    async def read(self, tenant: str, queue_id: str, from_seq: int, limit: int) -> pb.ReadResponse:
        return await self._lazy.stub.Read(  # type: ignore[no-any-return]
            pb.ReadRequest(tenant=tenant, queue_id=queue_id, from_seq=from_seq, limit=limit),
            timeout=self._timeout,
        )

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> None:
        await self._lazy.stub.Ack(
            pb.AckRequest(tenant=tenant, queue_id=queue_id, through_seq=through_seq),
            timeout=self._timeout,
        )

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        await self._lazy.stub.MarkReleased(
            pb.MarkReleasedRequest(tenant=tenant, queue_id=queue_id, seq=seq), timeout=self._timeout
        )

    async def drop(self, tenant: str, queue_id: str) -> None:
        await self._lazy.stub.Drop(
            pb.DropRequest(tenant=tenant, queue_id=queue_id), timeout=self._timeout
        )

    async def close(self) -> None:
        await self._lazy.close()
