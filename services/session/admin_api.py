"""The session service's admin servicer (SessionAdminService): users, ACLs, connected clients
and offline sessions; it checks and translates protobuf, and calls the authenticator, the
registry, the client listing and the offline sessions."""

from __future__ import annotations

import logging

import grpc
from nats.aio.client import Client

from services.common.acl import AclRule
from services.common.mqtt.errors import MqttError
from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.arguments import required, tenant_argument
from services.common.rpc.errors import InvalidArgumentError, NotFoundError
from services.common.topics import validate_topic_filter
from services.session import offline_api
from services.session.acl_codec import rule_from_pb, rule_to_pb
from services.session.auth import Authenticator
from services.session.credentials import check_kinds
from services.session.kicks import send_kick
from services.session.listing import ClientListing, HolderPage
from services.session.offline import OfflineSessions
from services.session.registry import Registry
from starling.common.v1 import message_pb2
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


def _checked_rule(r: pb.AclRule, index: int) -> AclRule:
    if r.permission not in (pb.PERMISSION_ALLOW, pb.PERMISSION_DENY):
        raise InvalidArgumentError(f"rules[{index}].permission must be ALLOW or DENY")
    if r.action not in (1, 2, 3):
        raise InvalidArgumentError(f"rules[{index}].action must be PUBLISH, SUBSCRIBE or ALL")
    probe = r.topic_filter.replace("%u", "u").replace("%c", "c")
    try:
        validate_topic_filter(probe)
    except MqttError as exc:
        raise InvalidArgumentError(f"rules[{index}].topic_filter: {exc}") from None
    return rule_from_pb(r)


class SessionAdminApi(pb_grpc.SessionAdminServiceServicer):
    def __init__(
        self,
        *,
        auth: Authenticator,
        registry: Registry,
        nc: Client,
        offline: OfflineSessions,
        listing: ClientListing,
    ) -> None:
        self._auth = auth
        self._registry = registry
        self._nc = nc
        self._offline = offline
        self._listing = listing

    async def CreateUser(
        self, request: pb.CreateUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateUserResponse:
        tenant = tenant_argument(request.tenant)
        required(request.username, "username")
        required(request.password, "password")
        if request.hash_scheme not in ("", "argon2", "bcrypt"):
            raise InvalidArgumentError("hash_scheme must be 'argon2' or 'bcrypt'")
        try:
            kinds = check_kinds(list(request.credentials))
        except ValueError as exc:
            raise InvalidArgumentError(f"credentials: {exc}") from None
        await self._auth.create_user(
            tenant, request.username, request.password, request.hash_scheme, kinds
        )
        log.info("user_created", extra={"tenant": tenant, "username": request.username})
        return pb.CreateUserResponse()

    async def DeleteUser(
        self, request: pb.DeleteUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteUserResponse:
        tenant = tenant_argument(request.tenant)
        deleted = await self._auth.delete_user(tenant, required(request.username, "username"))
        return pb.DeleteUserResponse(deleted=deleted)

    async def SetAcl(
        self, request: pb.SetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetAclResponse:
        tenant = tenant_argument(request.tenant)
        rules = [_checked_rule(r, i) for i, r in enumerate(request.rules)]
        await self._auth.set_acl(tenant, rules)
        return pb.SetAclResponse()

    async def GetAcl(
        self, request: pb.GetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAclResponse:
        rules = await self._auth.acl(tenant_argument(request.tenant))
        return pb.GetAclResponse(rules=[rule_to_pb(r) for r in rules])

    async def ListClients(
        self, request: pb.ListClientsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListClientsResponse:
        tenant = tenant_argument(request.tenant)
        if request.client_id:
            one = await self._registry.get(tenant, request.client_id)
            page = HolderPage(holders=(one,) if one else (), total=1 if one else 0)
        else:
            page = await self._listing.page(
                tenant, query=request.query, offset=request.offset, limit=request.limit
            )
        return pb.ListClientsResponse(
            total=page.total,
            clients=[
                message_pb2.ClientInfo(
                    tenant=h.tenant,
                    client_id=h.client_id,
                    username=h.username,
                    node_id=h.node_id,
                    peer_address=h.peer_address,
                    protocol_level=h.protocol_level,
                    connected_at_ms=h.connected_at_ms,
                    epoch=h.epoch,
                    clean_start=h.clean_start,
                )
                for h in page.holders
            ],
        )

    async def KickClient(
        self, request: pb.KickClientRequest, context: grpc.aio.ServicerContext
    ) -> pb.KickClientResponse:
        tenant = tenant_argument(request.tenant)
        holder = await self._registry.get(tenant, required(request.client_id, "client_id"))
        if holder is None:
            raise NotFoundError(f"client {request.client_id!r} is not connected in {tenant!r}")
        await send_kick(self._nc, holder, RC.ADMINISTRATIVE_ACTION)
        return pb.KickClientResponse(kicked=True)

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        return await offline_api.list_sessions(
            self._offline, tenant_argument(request.tenant), request
        )

    async def DiscardSession(
        self, request: pb.DiscardSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DiscardSessionResponse:
        tenant = tenant_argument(request.tenant)
        return await offline_api.discard_session(self._offline, tenant, request)
