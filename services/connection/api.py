"""Thin gRPC servicer of a connection node's admin API."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from services.common.rpc.errors import InvalidArgumentError, ServiceError
from starling.connection.v1 import connection_pb2 as pb
from starling.connection.v1 import connection_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from services.connection.main import ConnectionService


# A Server Reference goes into DISCONNECT and CONNACK packets: short, one line.
MAX_SERVER_REFERENCE = 1024


class ConnectionAdminApi(pb_grpc.ConnectionAdminServiceServicer):
    def __init__(self, service: ConnectionService) -> None:
        self._service = service

    async def Drain(
        self, request: pb.DrainRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrainResponse:
        drain = self._service.drain
        node = self._service.node
        if drain is None or node is None:
            raise ServiceError("node is not started", grpc.StatusCode.FAILED_PRECONDITION)
        ref = request.server_reference
        if len(ref) > MAX_SERVER_REFERENCE or not ref.isprintable():
            raise InvalidArgumentError(
                f"server_reference: at most {MAX_SERVER_REFERENCE} printable characters"
            )
        status = drain.begin(ref)
        return pb.DrainResponse(
            node_id=node.node_id,
            started=status.started,
            connections=status.connections,
            server_reference=status.server_reference,
            remaining_s=status.remaining_s,
        )

    async def GetNodeStats(
        self, request: pb.GetNodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetNodeStatsResponse:
        node = self._service.node
        if node is None:
            raise RuntimeError("node is not started")
        stats = node.stats.by_tenant()
        counters = list(stats.values())
        conns = list(node.registry.conns)
        return pb.GetNodeStatsResponse(
            stats=pb.NodeStats(
                node_id=node.node_id,
                connections=len(conns),
                messages_in=sum(c.messages_in for c in counters),
                messages_out=sum(c.messages_out for c in counters),
                messages_dropped=sum(c.dropped for c in counters),
                tenants=[
                    pb.TenantStats(
                        tenant=t,
                        messages_in=c.messages_in,
                        messages_out=c.messages_out,
                        messages_dropped=c.dropped,
                    )
                    for t, c in sorted(stats.items())
                ],
                client_drops=[
                    pb.ClientDrops(
                        tenant=c.channel.tenant,
                        client_id=c.channel.client_id,
                        dropped=c.channel.outbound.dropped,
                        expired=c.channel.outbound.expired,
                    )
                    for c in conns
                    if c.channel.outbound.dropped or c.channel.outbound.expired
                ],
            )
        )
