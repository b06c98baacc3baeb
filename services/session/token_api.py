"""gRPC servicers of the admin tokens: `TokenAdminApi` (operator: create, list, revoke) and
`TokenApi` (internal: resolve a token for another service's admin interceptor)."""

from __future__ import annotations

import grpc

from services.common.rpc.errors import InvalidArgumentError
from services.common.store.ports_auth import AdminTokenRecord
from services.session.tokens import AdminTokens
from starling.session.v1 import admin_tokens_pb2 as pb
from starling.session.v1 import admin_tokens_pb2_grpc as pb_grpc


def _info(r: AdminTokenRecord) -> pb.AdminTokenInfo:
    return pb.AdminTokenInfo(
        token_id=r.token_id,
        tenant=r.tenant,
        created_at_ms=r.created_at_ms,
        expires_at_ms=r.expires_at_ms,
        description=r.description,
    )


class TokenAdminApi(pb_grpc.TokenAdminServiceServicer):
    def __init__(self, tokens: AdminTokens) -> None:
        self._tokens = tokens

    async def CreateAdminToken(
        self, request: pb.CreateAdminTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateAdminTokenResponse:
        record, token = await self._tokens.create(
            request.tenant, request.ttl_s, request.description
        )
        return pb.CreateAdminTokenResponse(info=_info(record), token=token)

    async def ListAdminTokens(
        self, request: pb.ListAdminTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAdminTokensResponse:
        records = await self._tokens.list(request.tenant or None)
        return pb.ListAdminTokensResponse(tokens=[_info(r) for r in records])

    async def RevokeAdminToken(
        self, request: pb.RevokeAdminTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeAdminTokenResponse:
        if not request.token_id:
            raise InvalidArgumentError("token_id is required")
        return pb.RevokeAdminTokenResponse(revoked=await self._tokens.revoke(request.token_id))


class TokenApi(pb_grpc.TokenServiceServicer):
    def __init__(self, tokens: AdminTokens) -> None:
        self._tokens = tokens

    async def ResolveAdminToken(
        self, request: pb.ResolveAdminTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveAdminTokenResponse:
        grant = await self._tokens.resolve(request.token)
        if grant is None:
            return pb.ResolveAdminTokenResponse(valid=False)
        return pb.ResolveAdminTokenResponse(
            valid=True,
            tenant=grant.tenant,
            token_id=grant.token_id,
            expires_at_ms=grant.expires_at_ms,
        )
