"""Typed clients of the session service's admin tokens: `TokenAdminClient` for operators
(create, list, revoke), and `TokenClient` (services/common/rpc/token_resolution.py, exported
here) for every service's admin interceptor: which tenant does this token administer?"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.rpc.client import LazyStub
from services.common.rpc.token_resolution import TokenClient
from starling.session.v1 import admin_tokens_pb2 as pb
from starling.session.v1 import admin_tokens_pb2_grpc as pb_grpc

__all__ = ["AdminTokenInfo", "TokenAdminClient", "TokenClient"]


@dataclass(frozen=True, slots=True)
class AdminTokenInfo:
    """A token as listed (its secret is never stored, so never shown again)."""

    token_id: str
    tenant: str
    created_at_ms: int
    expires_at_ms: int  # 0: never
    description: str


def _info(p: pb.AdminTokenInfo) -> AdminTokenInfo:
    return AdminTokenInfo(p.token_id, p.tenant, p.created_at_ms, p.expires_at_ms, p.description)


class TokenAdminClient:
    """Operator only: tenant-scoped admin tokens."""

    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.TokenAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def create(
        self, tenant: str, ttl_s: int, description: str = ""
    ) -> tuple[AdminTokenInfo, str]:
        """(info, token): the token itself is returned this once."""
        req = pb.CreateAdminTokenRequest(tenant=tenant, ttl_s=ttl_s, description=description)
        resp = await self._rpc.call(self._rpc.stub.CreateAdminToken, req)
        return _info(resp.info), resp.token

    async def list(self, tenant: str = "") -> list[AdminTokenInfo]:
        req = pb.ListAdminTokensRequest(tenant=tenant)
        resp = await self._rpc.call(self._rpc.stub.ListAdminTokens, req)
        return [_info(t) for t in resp.tokens]

    async def revoke(self, token_id: str) -> bool:
        req = pb.RevokeAdminTokenRequest(token_id=token_id)
        resp = await self._rpc.call(self._rpc.stub.RevokeAdminToken, req)
        return bool(resp.revoked)

    async def close(self) -> None:
        await self._rpc.close()
