"""Thin gRPC servicers of the session service: translate protobuf, call auth and registry."""

from __future__ import annotations

import logging
import time

import grpc
from nats.aio.client import Client

from services.common.acl import Access, AclRule, substitute
from services.common.bus import subjects
from services.common.mqtt.errors import MqttError
from services.common.rpc.status import InvalidArgumentError, NotFoundError
from services.common.topics import validate_topic_filter
from services.session.auth import Authenticator, check_tenant, split_username
from services.session.events import Events
from services.session.registry import Holder, Registry
from services.session.sessions import Sessions
from starling.common.v1 import message_pb2
from starling.connection.v1 import connection_pb2
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SESSION_TAKEN_OVER = 0x8E
ADMINISTRATIVE_ACTION = 0x98


def rule_to_pb(r: AclRule) -> pb.AclRule:
    return pb.AclRule(
        permission=pb.PERMISSION_ALLOW if r.allow else pb.PERMISSION_DENY,
        action=int(r.access),
        topic_filter=r.topic_filter,
        username=r.username,
        client_id=r.client_id,
    )


def rule_from_pb(r: pb.AclRule, index: int) -> AclRule:
    if r.permission not in (pb.PERMISSION_ALLOW, pb.PERMISSION_DENY):
        raise InvalidArgumentError(f"rules[{index}].permission must be ALLOW or DENY")
    if r.action not in (1, 2, 3):
        raise InvalidArgumentError(f"rules[{index}].action must be PUBLISH, SUBSCRIBE or ALL")
    probe = r.topic_filter.replace("%u", "u").replace("%c", "c")
    try:
        validate_topic_filter(probe)
    except MqttError as exc:
        raise InvalidArgumentError(f"rules[{index}].topic_filter: {exc}") from None
    return AclRule(
        r.permission == pb.PERMISSION_ALLOW,
        Access(r.action),
        r.topic_filter,
        r.username,
        r.client_id,
    )


async def send_kick(nc: Client, holder: Holder, reason: int) -> None:
    kick = connection_pb2.Kick(
        tenant=holder.tenant, client_id=holder.client_id, epoch=holder.epoch, reason_code=reason
    )
    await nc.publish(subjects.node_control(holder.node_id), kick.SerializeToString())
    await nc.flush(timeout=2)


class SessionApi(pb_grpc.SessionServiceServicer):
    def __init__(
        self,
        auth: Authenticator,
        registry: Registry,
        nc: Client,
        events: Events,
        acl_default_allow: bool,
        sessions: Sessions,
    ) -> None:
        self._auth = auth
        self._registry = registry
        self._nc = nc
        self._events = events
        self._acl_default = pb.PERMISSION_ALLOW if acl_default_allow else pb.PERMISSION_DENY
        self._sessions = sessions

    async def Connect(
        self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConnectResponse:
        try:
            tenant, name = split_username(request.username)
        except ValueError as exc:
            return pb.ConnectResponse(result=pb.CONNECT_RESULT_BAD_CREDENTIALS, reason=str(exc))
        password = request.password if request.HasField("password") else None
        verdict = await self._auth.check(tenant, name, password)
        if verdict is False:
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_BAD_CREDENTIALS, reason="bad user name or password"
            )
        if verdict is None and not self._auth.anonymous_allowed(tenant):
            result = pb.CONNECT_RESULT_BAD_CREDENTIALS if name else pb.CONNECT_RESULT_NOT_AUTHORIZED
            return pb.ConnectResponse(result=result, reason="anonymous access is off for tenant")
        if not request.client_id:
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_CLIENT_ID_INVALID, reason="client id required"
            )
        epoch = await self._registry.next_epoch(tenant, request.client_id)
        holder = Holder(
            tenant,
            request.client_id,
            request.node_id,
            epoch,
            name,
            request.peer_address,
            request.protocol_level,
            int(time.time() * 1000),
            request.clean_start,
        )
        claim = await self._registry.claim(holder)
        if not claim.won:
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_TAKEN_OVER,
                tenant=tenant,
                epoch=epoch,
                reason="a newer connection holds the session",
            )
        prev = claim.previous
        if prev is not None and prev.epoch != epoch:
            await send_kick(self._nc, prev, SESSION_TAKEN_OVER)
            await self._events.emit(tenant, request.client_id, "taken_over")
        opened = await self._sessions.open(
            tenant, request.client_id, request.clean_start, request.session_expiry_interval_s
        )
        rules = substitute(await self._auth.acl(tenant), name, request.client_id)
        await self._events.emit(
            tenant,
            request.client_id,
            "connected",
            username=name,
            peer_address=request.peer_address,
            protocol_level=request.protocol_level,
            clean_start=request.clean_start,
            epoch=epoch,
        )
        return pb.ConnectResponse(
            result=pb.CONNECT_RESULT_OK,
            tenant=tenant,
            epoch=epoch,
            session_present=opened.present,
            acl=[rule_to_pb(r) for r in rules],
            acl_default=self._acl_default,
            incarnation=opened.incarnation,
            subscriptions=opened.subscriptions,
            session_expiry_interval_s=opened.expiry_s,
        )

    async def Disconnect(
        self, request: pb.DisconnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.DisconnectResponse:
        removed = await self._registry.release(request.tenant, request.client_id, request.epoch)
        if request.node_id:
            await self._registry.forget_on_node(request.node_id, request.tenant, request.client_id)
        if removed:  # only the current holder may end or park the session
            expiry = (
                request.session_expiry_interval_s
                if request.HasField("session_expiry_interval_s")
                else None
            )
            await self._sessions.close(
                request.tenant, request.client_id, request.incarnation, expiry
            )
        await self._events.emit(
            request.tenant, request.client_id, "disconnected", epoch=request.epoch
        )
        return pb.DisconnectResponse(removed=removed)


def _require(value: str, name: str) -> str:
    if not value:
        raise InvalidArgumentError(f"{name} is required")
    return value


class SessionAdminApi(pb_grpc.SessionAdminServiceServicer):
    def __init__(self, auth: Authenticator, registry: Registry, nc: Client) -> None:
        self._auth = auth
        self._registry = registry
        self._nc = nc

    @staticmethod
    def _tenant(value: str) -> str:
        _require(value, "tenant")
        try:
            check_tenant(value)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return value

    async def CreateUser(
        self, request: pb.CreateUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateUserResponse:
        tenant = self._tenant(request.tenant)
        _require(request.username, "username")
        _require(request.password, "password")
        if request.hash_scheme not in ("", "argon2", "bcrypt"):
            raise InvalidArgumentError("hash_scheme must be 'argon2' or 'bcrypt'")
        await self._auth.create_user(
            tenant, request.username, request.password, request.hash_scheme
        )
        log.info("user_created", extra={"tenant": tenant, "username": request.username})
        return pb.CreateUserResponse()

    async def DeleteUser(
        self, request: pb.DeleteUserRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteUserResponse:
        tenant = self._tenant(request.tenant)
        deleted = await self._auth.delete_user(tenant, _require(request.username, "username"))
        return pb.DeleteUserResponse(deleted=deleted)

    async def SetAcl(
        self, request: pb.SetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetAclResponse:
        tenant = self._tenant(request.tenant)
        rules = [rule_from_pb(r, i) for i, r in enumerate(request.rules)]
        await self._auth.set_acl(tenant, rules)
        return pb.SetAclResponse()

    async def GetAcl(
        self, request: pb.GetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAclResponse:
        rules = await self._auth.acl(self._tenant(request.tenant))
        return pb.GetAclResponse(rules=[rule_to_pb(r) for r in rules])

    async def ListClients(
        self, request: pb.ListClientsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListClientsResponse:
        holders = await self._registry.list(self._tenant(request.tenant))
        return pb.ListClientsResponse(
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
                for h in holders
            ]
        )

    async def KickClient(
        self, request: pb.KickClientRequest, context: grpc.aio.ServicerContext
    ) -> pb.KickClientResponse:
        tenant = self._tenant(request.tenant)
        holder = await self._registry.get(tenant, _require(request.client_id, "client_id"))
        if holder is None:
            raise NotFoundError(f"client {request.client_id!r} is not connected in {tenant!r}")
        await send_kick(self._nc, holder, ADMINISTRATIVE_ACTION)
        return pb.KickClientResponse(kicked=True)
