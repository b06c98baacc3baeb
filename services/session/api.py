"""Thin gRPC servicers of the session service: translate protobuf, call auth and registry."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
from nats.aio.client import Client
from nats.errors import NoRespondersError

from services.common.acl import AclRule, substitute
from services.common.bus import subjects
from services.common.bus.client import request_proto
from services.common.mqtt.errors import MqttError
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals
from services.common.rpc.errors import InvalidArgumentError, NotFoundError
from services.common.store.ports import Qos2Change, Qos2Update, SessionRecord
from services.common.subscription import record_to_pb
from services.common.tenant_name import check_tenant
from services.common.topics import validate_topic_filter
from services.session.acl_codec import rule_from_pb, rule_to_pb
from services.session.auth import Authenticator
from services.session.client import CONNECT_BATCH, RECLAIM_BATCH
from services.session.core import may_use
from services.session.credentials import check_kinds
from services.session.enhanced import CONTINUE
from services.session.events import Events
from services.session.fence import announce_loss, reclaimed_holder
from services.session.gatekeeper import Gatekeeper
from services.session.locks import KeyedLocks
from services.session.login import Login
from services.session.registry import Holder, Registry
from services.session.sessions import (
    UNREAD,
    Opened,
    Sessions,
    StaleConnectError,
    Unread,
    owner_of,
)
from services.session.wills import StoredWills, displaced_will_due, kept_will
from starling.common.v1 import message_pb2
from starling.connection.v1 import connection_pb2
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SESSION_TAKEN_OVER = 0x8E
# Updates per RecordQos2 request: a node sends at most this many in one (persistence.py
# QOS2_BATCH), so one request is one bounded transaction.
MAX_QOS2_UPDATES = 4096
ADMINISTRATIVE_ACTION = 0x98
KICK_REPLY_TIMEOUT_S = 1.0
# A node whose kick timed out and that has not beaten for this long is taken for dead.
NODE_SILENT_S = 2.5


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


def _kick(holder: Holder, reason: int) -> connection_pb2.Kick:
    return connection_pb2.Kick(
        tenant=holder.tenant, client_id=holder.client_id, epoch=holder.epoch, reason_code=reason
    )


async def send_kick(nc: Client, holder: Holder, reason: int) -> None:
    await nc.publish(
        subjects.node_control(holder.node_id), _kick(holder, reason).SerializeToString()
    )
    await nc.flush(timeout=2)


async def kick_and_ask(
    nc: Client, holder: Holder, reason: int
) -> tuple[connection_pb2.KickReply | None, bool]:
    """Kick the displaced connection and learn whether it had already ended (and with which
    Session Expiry); no reply when its node does not answer in time. Also whether its node
    is known to be gone: nobody listens on its subject (its process died), or it answers as
    a process that never had the connection (it restarted under the same id)."""
    try:
        reply = await request_proto(
            nc,
            subjects.node_control(holder.node_id),
            _kick(holder, reason),
            connection_pb2.KickReply,
            timeout_s=KICK_REPLY_TIMEOUT_S,
        )
    except NoRespondersError:
        log.warning("kick_unanswered", extra={"node": holder.node_id, "error": "no responders"})
        return None, True
    except Exception as exc:  # a timeout: the node is dying, or busy
        log.warning("kick_unanswered", extra={"node": holder.node_id, "error": type(exc).__name__})
        return None, False
    return reply, reply.unknown


# CONNACK reason code of a refusal -> the ConnectResult that carries it to the node.
_RESULTS = {
    0: pb.CONNECT_RESULT_OK,
    CONTINUE: pb.CONNECT_RESULT_CONTINUE,
    RC.BAD_USER_NAME_OR_PASSWORD: pb.CONNECT_RESULT_BAD_CREDENTIALS,
    RC.NOT_AUTHORIZED: pb.CONNECT_RESULT_NOT_AUTHORIZED,
    RC.CLIENT_IDENTIFIER_NOT_VALID: pb.CONNECT_RESULT_CLIENT_ID_INVALID,
    RC.SERVER_BUSY: pb.CONNECT_RESULT_SERVER_BUSY,
    RC.SERVER_UNAVAILABLE: pb.CONNECT_RESULT_SERVER_UNAVAILABLE,
    RC.BAD_AUTHENTICATION_METHOD: pb.CONNECT_RESULT_BAD_AUTH_METHOD,
    RC.BANNED: pb.CONNECT_RESULT_BANNED,
}


def connect_result(code: int) -> pb.ConnectResult.ValueType:
    return _RESULTS.get(code, pb.CONNECT_RESULT_NOT_AUTHORIZED)


class SessionApi(pb_grpc.SessionServiceServicer):
    def __init__(
        self,
        auth: Authenticator,
        registry: Registry,
        nc: Client,
        events: Events,
        acl_default_allow: bool,
        sessions: Sessions,
        login: Login,
        max_connections_per_tenant: int = 0,
        shared_client_id_tenants: list[str] | None = None,
        refusals: Refusals | None = None,
        gatekeeper: Gatekeeper | None = None,
        wills: StoredWills | None = None,
        will_store_max_bytes: int = 0,
        silent_for: Callable[[str], float] | None = None,
    ) -> None:
        self._auth = auth
        # Wills kept with registry entries, published here when their node is gone.
        self._wills = wills
        self._will_max_bytes = will_store_max_bytes if wills is not None else 0
        # Seconds since a node's last heartbeat (services/session/liveness.py).
        self._silent_for = silent_for or (lambda node: 0.0)
        self._gatekeeper = gatekeeper
        self._login = login
        self._registry = registry
        self._nc = nc
        self._events = events
        self._acl_default = pb.PERMISSION_ALLOW if acl_default_allow else pb.PERMISSION_DENY
        self._sessions = sessions
        self._locks = KeyedLocks()  # CONNECT and DISCONNECT of one client id, in order
        self._max_connections = max_connections_per_tenant
        self._shared_ids = set(shared_client_id_tenants or ())
        self.refusals = refusals or Refusals()

    async def Connect(
        self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConnectResponse:
        admission = await self._login.connect(request)
        if admission.code:
            return pb.ConnectResponse(
                result=connect_result(admission.code),
                reason=admission.reason,
                auth_data=admission.auth_data,
                auth_state=admission.auth_state,
            )
        tenant, name = admission.tenant, admission.name
        if not request.client_id:
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_CLIENT_ID_INVALID, reason="client id required"
            )
        if self._gatekeeper is not None:
            refused = await self._gatekeeper.check(
                tenant, request.client_id, name, request.peer_address
            )
            if refused:
                self.refusals.count("banned", tenant)
                return pb.ConnectResponse(result=pb.CONNECT_RESULT_BANNED, reason=refused)
        # Whom the session belongs to: the authenticated user, or "" for an anonymous client
        # (whatever user name it gave).
        owner = name if admission.authenticated else ""
        rules = substitute([*admission.acl, *await self._auth.acl(tenant)], name, request.client_id)
        will = kept_will(
            request.will, rules, self._acl_default == pb.PERMISSION_ALLOW, self._will_max_bytes
        )
        async with self._locks.hold((tenant, request.client_id)):
            claimed = await self._claim_and_open(tenant, name, owner, request, will)
        if isinstance(claimed, pb.ConnectResponse):
            return claimed
        epoch, opened = claimed
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
            subscriptions=[record_to_pb(r) for r in opened.subscriptions],
            awaiting_release=[
                pb.InboundQos2(packet_id=q.packet_id, message_id=q.message_id, stored=q.stored)
                for q in opened.awaiting_release
            ],
            session_expiry_interval_s=opened.expiry_s,
            auth_data=admission.auth_data,
            username=f"{tenant}/{name}",
            no_previous_session=not opened.previous,
            qos2_fence=opened.qos2_fence,
        )

    async def ConnectMany(
        self, request: pb.ConnectManyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConnectManyResponse:
        """The CONNECTs one node received in one loop turn, each exactly `Connect`, at once
        (they share the registry's Redis pipeline and the store's trips)."""
        if len(request.requests) > CONNECT_BATCH:
            raise InvalidArgumentError(f"requests: at most {CONNECT_BATCH} per call")
        answers = await asyncio.gather(
            *(self.Connect(r, context) for r in request.requests), return_exceptions=True
        )
        out = pb.ConnectManyResponse()
        for r, answer in zip(request.requests, answers, strict=True):
            if isinstance(answer, pb.ConnectResponse):
                out.responses.append(answer)
                continue
            # One CONNECT's failure is its own: the others keep their answers.
            log.warning(
                "connect_failed",
                extra={"client_id": r.client_id, "error": type(answer).__name__},
                exc_info=answer if not isinstance(answer, InvalidArgumentError) else None,
            )
            out.responses.append(
                pb.ConnectResponse(
                    result=pb.CONNECT_RESULT_SERVER_UNAVAILABLE, reason="the CONNECT failed"
                )
            )
        return out

    async def Reauthenticate(
        self, request: pb.ReauthenticateRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReauthenticateResponse:
        admission = await self._login.reauthenticate(request)
        if admission.code and admission.code != CONTINUE:
            log.info(
                "reauthentication_refused",
                extra={"tenant": request.tenant, "client_id": request.client_id},
            )
        return pb.ReauthenticateResponse(
            result=connect_result(admission.code),
            auth_data=admission.auth_data,
            auth_state=admission.auth_state,
            reason=admission.reason,
        )

    async def RecordQos2(
        self, request: pb.RecordQos2Request, context: grpc.aio.ServicerContext
    ) -> pb.RecordQos2Response:
        """QoS 2 receiver state of persistent sessions: durable before the answer, which
        the node waits for before routing a publish (RECEIVED) or sending PUBCOMP (RELEASED)."""
        await self._sessions.record_qos2(qos2_updates(request))
        return pb.RecordQos2Response()

    async def _claim_and_open(
        self, tenant: str, name: str, owner: str, request: pb.ConnectRequest, will: str = ""
    ) -> pb.ConnectResponse | tuple[int, Opened]:
        """Check the client id is the user's to use, take a new registry epoch for it (within
        the tenant's connection cap), settle the connection it displaces, then open or resume
        the session.

        Round trips: one store read of the session record (the owner check, and the open
        unless a displaced connection's settlement changed it) and one registry script (the
        installed connection's owner check, the claim, the node's set). Both checks come
        before anything is installed: a refused CONNECT must not kick the connection it would
        have displaced."""
        client_id = request.client_id
        shared = "*" in self._shared_ids or tenant in self._shared_ids
        rec = await self._sessions.read(tenant, client_id)
        if not shared and not may_use(owner_of(rec), owner):
            return self._not_owner(tenant)
        holder = Holder(
            tenant,
            client_id,
            request.node_id,
            self._registry.next_epoch(),
            name,
            request.peer_address,
            request.protocol_level,
            int(time.time() * 1000),
            request.clean_start,
            owner,
            will,
            # A Will Delay Interval never outlasts the session [MQTT-3.1.3-9].
            min(
                request.will_delay_s,
                request.session_expiry_interval_s,
                self._sessions.max_expiry_s,
            )
            if will
            else 0,
        )
        # A persistent session (online or offline) counts against the tenant's max_sessions
        # from the CONNECT that opens it until it ends (services/session/sessions.py).
        persistent = min(request.session_expiry_interval_s, self._sessions.max_expiry_s) > 0
        claim = await self._registry.claim(
            holder, self._max_connections, check_owner=not shared, persistent=persistent
        )
        if claim.generation:
            # The registry was empty: connections from before may still be live on their
            # nodes, unknown to it; they re-assert, and a copy of this client id is kicked.
            await announce_loss(self._nc, claim.generation)
        if claim.not_owner:
            return self._not_owner(tenant)
        epoch = claim.epoch
        if claim.quota:
            self.refusals.count(claim.quota, tenant)
            await self._events.emit(tenant, client_id, "quota_exceeded", limit=claim.quota)
            what = "clients connected" if claim.quota != "max_sessions" else "sessions"
            whose = "user" if claim.quota == "max_connections_per_user" else "tenant"
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_QUOTA_EXCEEDED,
                reason=f"the {whose} has {claim.cap} {what} (quota {claim.quota})",
            )
        if claim.full:
            # The setting's cap or the tenant's quota (`starling quota set`), the lower one.
            limit = (
                "connections_per_tenant"
                if self._max_connections and claim.cap == self._max_connections
                else "max_connections"
            )
            self.refusals.count(limit, tenant)
            await self._events.emit(tenant, client_id, "quota_exceeded", limit=limit)
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_QUOTA_EXCEEDED,
                reason=f"the tenant has {claim.cap} clients connected",
            )
        if not claim.won:
            return pb.ConnectResponse(
                result=pb.CONNECT_RESULT_TAKEN_OVER,
                tenant=tenant,
                epoch=epoch,
                reason="a newer connection holds the session",
            )
        prev = claim.previous
        known: SessionRecord | Unread | None = rec
        if prev is not None and prev.epoch != epoch:
            await self._settle_displaced(prev, request.clean_start)
            known = UNREAD  # the displaced connection's end may have changed the record
        try:
            opened = await self._sessions.open(
                tenant,
                client_id,
                request.clean_start,
                request.session_expiry_interval_s,
                owner,
                known,
                epoch=epoch,
                current=lambda: self._holds(tenant, client_id, epoch),
            )
        except StaleConnectError as exc:
            return await self._stale(tenant, request, epoch, exc)
        return epoch, opened

    async def _stale(
        self, tenant: str, request: pb.ConnectRequest, epoch: int, exc: StaleConnectError
    ) -> pb.ConnectResponse:
        """A later connection took the client id while this CONNECT opened the session (on
        another instance): answered as if that one's claim had come first."""
        log.info("connect_stale", extra={"client_id": request.client_id, "why": str(exc)})
        # Its registry entry (and kept will) goes: no connection will hold it.
        await self._registry.end(tenant, request.client_id, epoch, request.node_id)
        return pb.ConnectResponse(
            result=pb.CONNECT_RESULT_TAKEN_OVER,
            tenant=tenant,
            epoch=epoch,
            reason="a newer connection holds the session",
        )

    async def _holds(self, tenant: str, client_id: str, epoch: int) -> bool:
        """This connection's registry entry is still the client id's installed one."""
        holder = await self._registry.get(tenant, client_id)
        return holder is not None and holder.epoch == epoch

    def _not_owner(self, tenant: str) -> pb.ConnectResponse:
        self.refusals.count("client_id_owner", tenant)
        return pb.ConnectResponse(
            result=pb.CONNECT_RESULT_NOT_AUTHORIZED,
            reason="the client id belongs to another user",
        )

    async def Reclaim(
        self, request: pb.ReclaimRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReclaimResponse:
        """A node re-asserts its live connections after the registry was lost: each is
        installed again unless a later connection holds its client id (then its node is
        kicked for it); one it displaces (an earlier epoch elsewhere) is kicked."""
        node_id = _require(request.node_id, "node_id")
        if len(request.connections) > RECLAIM_BATCH:
            raise InvalidArgumentError(f"connections: at most {RECLAIM_BATCH} per call")
        reclaimed = superseded = 0
        for c in request.connections:
            holder = reclaimed_holder(node_id, c, self._will_max_bytes)
            async with self._locks.hold((holder.tenant, holder.client_id)):
                claim = await self._registry.reclaim(holder)
            if not claim.won:
                superseded += 1
                await send_kick(self._nc, holder, SESSION_TAKEN_OVER)
                await self._events.emit(holder.tenant, holder.client_id, "taken_over")
                continue
            reclaimed += 1
            prev = claim.previous
            if prev is not None and prev.epoch != holder.epoch:
                await send_kick(self._nc, prev, SESSION_TAKEN_OVER)
                await self._events.emit(prev.tenant, prev.client_id, "taken_over")
        log.warning(
            "registry_reclaimed",
            extra={"node": node_id, "reclaimed": reclaimed, "superseded": superseded},
        )
        return pb.ReclaimResponse(reclaimed=reclaimed, superseded=superseded)

    async def _settle_displaced(self, prev: Holder, clean_start: bool) -> None:
        """Kick the connection a new one displaces; if it had already ended (its release is
        still on its way and will be refused), end the session as its DISCONNECT said before
        Session Present is decided. A node that does not answer is gone, and its will with
        it: published from here if it is due now (services/session/wills.py)."""
        reply, gone = await kick_and_ask(self._nc, prev, SESSION_TAKEN_OVER)
        if prev.will and self._wills is not None:
            silent_s = self._silent_for(prev.node_id)
            # A node that timed out but still beats publishes the will itself when it gets
            # to the kick.
            if gone or (reply is None and silent_s >= NODE_SILENT_S):
                if displaced_will_due(prev, clean_start, silent_s):
                    self._wills.publish_now(prev)
        if reply is None or not reply.ended:
            await self._events.emit(prev.tenant, prev.client_id, "taken_over")
            return
        expiry = (
            reply.session_expiry_interval_s if reply.HasField("session_expiry_interval_s") else None
        )
        await self._sessions.ended(prev.tenant, prev.client_id, expiry, prev.epoch)

    async def Disconnect(
        self, request: pb.DisconnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.DisconnectResponse:
        async with self._locks.hold((request.tenant, request.client_id)):
            ended = await self._registry.end(
                request.tenant, request.client_id, request.epoch, request.node_id
            )
            # No entry at all (-1): the registry was lost while this connection lived (it
            # ended before its node re-asserted it), so it was still the session's holder.
            holder = ended != 0
            if holder:  # only the current holder may end or park the session
                expiry = (
                    request.session_expiry_interval_s
                    if request.HasField("session_expiry_interval_s")
                    else None
                )
                await self._sessions.close(
                    request.tenant,
                    request.client_id,
                    request.incarnation,
                    expiry,
                    request.qos2_fence,
                )
        await self._events.emit(
            request.tenant, request.client_id, "disconnected", epoch=request.epoch
        )
        return pb.DisconnectResponse(removed=ended == 1)


_QOS2_CHANGES = {
    pb.QOS2_CHANGE_RECEIVED: Qos2Change.RECEIVED,
    pb.QOS2_CHANGE_STORED: Qos2Change.STORED,
    pb.QOS2_CHANGE_RELEASED: Qos2Change.RELEASED,
}


def qos2_updates(request: pb.RecordQos2Request) -> list[Qos2Update]:
    """The request's updates, checked: INVALID_ARGUMENT names the first bad one."""
    if len(request.updates) > MAX_QOS2_UPDATES:
        raise InvalidArgumentError(f"at most {MAX_QOS2_UPDATES} updates per request")
    out = []
    for i, u in enumerate(request.updates):
        change = _QOS2_CHANGES.get(u.change)
        if change is None:
            raise InvalidArgumentError(f"updates[{i}].change must be RECEIVED, STORED or RELEASED")
        if not 1 <= u.packet_id <= 65535:
            raise InvalidArgumentError(f"updates[{i}].packet_id must be 1..65535")
        if not u.tenant or not u.client_id:
            raise InvalidArgumentError(f"updates[{i}]: tenant and client_id are required")
        if change != Qos2Change.RELEASED and not u.message_id:
            raise InvalidArgumentError(f"updates[{i}].message_id is required for {change}")
        out.append(
            Qos2Update(
                u.tenant, u.client_id, u.incarnation, change, u.packet_id, u.message_id, u.fence
            )
        )
    return out


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
        tenant = self._tenant(request.tenant)
        deleted = await self._auth.delete_user(tenant, _require(request.username, "username"))
        return pb.DeleteUserResponse(deleted=deleted)

    async def SetAcl(
        self, request: pb.SetAclRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetAclResponse:
        tenant = self._tenant(request.tenant)
        rules = [_checked_rule(r, i) for i, r in enumerate(request.rules)]
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
