"""Typed client of a connection node's admin API: `ConnectionAdminClient` for operators
(`starling drain`)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.rpc.client import LazyStub
from starling.connection.v1 import connection_pb2 as pb
from starling.connection.v1 import connection_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True)
class DrainProgress:
    node_id: str
    started: bool  # this request began the drain (false: it was under way already)
    connections: int  # still open on the node
    server_reference: str  # what MQTT 5 clients are told (empty: nothing)
    remaining_s: float  # before the node closes what remains and exits


class ConnectionAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.ConnectionAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def drain(self, server_reference: str = "") -> DrainProgress:
        """Begin draining the node, or (already draining) how far it got."""
        req = pb.DrainRequest(server_reference=server_reference)
        r = await self._rpc.call(self._rpc.stub.Drain, req)
        return DrainProgress(
            r.node_id, r.started, r.connections, r.server_reference, round(r.remaining_s, 1)
        )

    async def close(self) -> None:
        await self._rpc.close()
