"""`TokenClient`: how every service's admin interceptor asks the session service, which keeps
the tenant admin tokens, which tenant a token administers (the call carries the mesh
secret). The operators' client of the tokens is services/session/token_client.py."""

from __future__ import annotations

from services.common.rpc.admin_auth import TenantGrant
from services.common.rpc.client import LazyStub
from starling.session.v1 import admin_tokens_pb2 as pb
from starling.session.v1 import admin_tokens_pb2_grpc as pb_grpc


class TokenClient:
    """Internal: resolves tenant tokens."""

    def __init__(self, address: str, timeout_s: float = 3.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.TokenServiceStub, timeout_s=timeout_s)

    async def resolve(self, token: str) -> TenantGrant | None:
        req = pb.ResolveAdminTokenRequest(token=token)
        resp = await self._rpc.call(self._rpc.stub.ResolveAdminToken, req)
        if not resp.valid:
            return None
        return TenantGrant(resp.tenant, resp.token_id, resp.expires_at_ms)

    async def close(self) -> None:
        await self._rpc.close()
