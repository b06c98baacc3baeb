"""Typed client of a connection node's admin API: `ConnectionAdminClient` for operators
(`starling drain`, the console's overview and operations pages)."""

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


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """A node's own counters (cumulative since it started) and open connections."""

    node_id: str
    connections: int
    messages_in: int
    messages_out: int
    messages_dropped: int


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

    async def node_stats(self) -> NodeFigures:
        """The node's connections and message counters (operator token)."""
        r = await self._rpc.call(self._rpc.stub.GetNodeStats, pb.GetNodeStatsRequest())
        st = r.stats
        return NodeFigures(
            st.node_id, st.connections, st.messages_in, st.messages_out, st.messages_dropped
        )

    async def close(self) -> None:
        await self._rpc.close()
