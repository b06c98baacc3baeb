"""Typed client of the session service, used by connection nodes and the CLI."""

from __future__ import annotations

import grpc

from services.common.rpc.server import LazyStub
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc


class SessionClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._lazy = LazyStub(address, pb_grpc.SessionServiceStub)
        self._timeout = timeout_s

    async def connect(self, request: pb.ConnectRequest) -> pb.ConnectResponse:
        return await self._lazy.stub.Connect(request, timeout=self._timeout)  # type: ignore[no-any-return]

    async def disconnect(
        self,
        tenant: str,
        client_id: str,
        epoch: int,
        node_id: str,
        incarnation: int = 0,
        expiry_s: int | None = None,
    ) -> bool:
        req = pb.DisconnectRequest(
            tenant=tenant,
            client_id=client_id,
            epoch=epoch,
            node_id=node_id,
            incarnation=incarnation,
        )
        if expiry_s is not None:
            req.session_expiry_interval_s = expiry_s
        resp = await self._lazy.stub.Disconnect(req, timeout=self._timeout)
        return bool(resp.removed)

    async def close(self) -> None:
        await self._lazy.close()


def admin_stub(ch: grpc.aio.Channel) -> pb_grpc.SessionAdminServiceStub:
    return pb_grpc.SessionAdminServiceStub(ch)
