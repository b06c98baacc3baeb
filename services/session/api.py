"""The session service's servicer (SessionService): it checks and translates protobuf and
calls the login (services/session/login.py), the CONNECT flow (services/session/connecting.py)
and the sessions (services/session/sessions.py). The admin servicer is in admin_api.py."""

from __future__ import annotations

import asyncio
import logging

import grpc

from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.errors import InvalidArgumentError
from services.common.store.ports_session import Qos2Change, Qos2Update
from services.common.subscription import record_to_pb
from services.session.acl_codec import rule_to_pb
from services.session.client import CONNECT_BATCH, RECLAIM_BATCH
from services.session.connecting import Attempt, Connected, Connecting, Ended, Refused
from services.session.enhanced import CONTINUE
from services.session.fence import reclaimed_holder
from services.session.login import Admission, Login
from services.session.sessions import Sessions
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# Updates per RecordQos2 request: a node sends at most this many in one (persistence.py
# QOS2_BATCH), so one request is one bounded transaction.
MAX_QOS2_UPDATES = 4096

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
# The CONNECT flow's refusals besides those (services/session/connecting.py).
_FLOW_RESULTS = {
    **_RESULTS,
    RC.QUOTA_EXCEEDED: pb.CONNECT_RESULT_QUOTA_EXCEEDED,
    RC.SESSION_TAKEN_OVER: pb.CONNECT_RESULT_TAKEN_OVER,
}


def connect_result(code: int) -> pb.ConnectResult.ValueType:
    return _RESULTS.get(code, pb.CONNECT_RESULT_NOT_AUTHORIZED)


def _attempt(r: pb.ConnectRequest) -> Attempt:
    return Attempt(
        client_id=r.client_id,
        node_id=r.node_id,
        peer_address=r.peer_address,
        protocol_level=r.protocol_level,
        clean_start=r.clean_start,
        session_expiry_s=r.session_expiry_interval_s,
        will=r.will,
        will_delay_s=r.will_delay_s,
    )


def _refused(admission: Admission) -> pb.ConnectResponse:
    return pb.ConnectResponse(
        result=connect_result(admission.code),
        reason=admission.reason,
        auth_data=admission.auth_data,
        auth_state=admission.auth_state,
    )


def _flow_refused(refused: Refused, tenant: str) -> pb.ConnectResponse:
    # A CONNECT a newer connection won names the epoch it had claimed, and its tenant.
    return pb.ConnectResponse(
        result=_FLOW_RESULTS.get(refused.code, pb.CONNECT_RESULT_NOT_AUTHORIZED),
        reason=refused.reason,
        tenant=tenant if refused.epoch else "",
        epoch=refused.epoch,
    )


def _connected(
    c: Connected, admission: Admission, acl_default: pb.Permission.ValueType
) -> pb.ConnectResponse:
    opened, tenant = c.opened, admission.tenant
    return pb.ConnectResponse(
        result=pb.CONNECT_RESULT_OK,
        tenant=tenant,
        epoch=c.epoch,
        session_present=opened.present,
        acl=[rule_to_pb(r) for r in c.rules],
        acl_default=acl_default,
        incarnation=opened.incarnation,
        subscriptions=[record_to_pb(r) for r in opened.subscriptions],
        awaiting_release=[
            pb.InboundQos2(packet_id=q.packet_id, message_id=q.message_id, stored=q.stored)
            for q in opened.awaiting_release
        ],
        session_expiry_interval_s=opened.expiry_s,
        auth_data=admission.auth_data,
        username=f"{tenant}/{admission.name}",
        no_previous_session=not opened.previous,
        qos2_fence=opened.qos2_fence,
    )


class SessionApi(pb_grpc.SessionServiceServicer):
    def __init__(
        self, *, login: Login, connecting: Connecting, sessions: Sessions, acl_default_allow: bool
    ) -> None:
        self._login = login
        self._connecting = connecting
        self._sessions = sessions
        self._acl_default = pb.PERMISSION_ALLOW if acl_default_allow else pb.PERMISSION_DENY

    async def Connect(
        self, request: pb.ConnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.ConnectResponse:
        admission = await self._login.connect(request)
        if admission.code:
            return _refused(admission)
        outcome = await self._connecting.connect(admission, _attempt(request))
        if isinstance(outcome, Refused):
            return _flow_refused(outcome, admission.tenant)
        return _connected(outcome, admission, self._acl_default)

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

    async def Reclaim(
        self, request: pb.ReclaimRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReclaimResponse:
        """A node re-asserts its live connections after the registry was lost
        (Connecting.reclaim)."""
        node_id = request.node_id
        if not node_id:
            raise InvalidArgumentError("node_id is required")
        if len(request.connections) > RECLAIM_BATCH:
            raise InvalidArgumentError(f"connections: at most {RECLAIM_BATCH} per call")
        max_bytes = self._connecting.will_max_bytes
        holders = [reclaimed_holder(node_id, c, max_bytes) for c in request.connections]
        reclaimed, superseded = await self._connecting.reclaim(node_id, holders)
        return pb.ReclaimResponse(reclaimed=reclaimed, superseded=superseded)

    async def Disconnect(
        self, request: pb.DisconnectRequest, context: grpc.aio.ServicerContext
    ) -> pb.DisconnectResponse:
        removed = await self._connecting.disconnect(
            Ended(
                tenant=request.tenant,
                client_id=request.client_id,
                epoch=request.epoch,
                node_id=request.node_id,
                incarnation=request.incarnation,
                session_expiry_s=(
                    request.session_expiry_interval_s
                    if request.HasField("session_expiry_interval_s")
                    else None
                ),
                qos2_fence=request.qos2_fence,
            )
        )
        return pb.DisconnectResponse(removed=removed)


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
