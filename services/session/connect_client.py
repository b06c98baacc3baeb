"""CONNECT on the wire between a connection node and the session service: a
`ConnectAttempt` as a `ConnectRequest`, and the answers (`ConnectResponse`,
`ReauthenticateResponse`) as the `ConnectOutcome` the channel uses (a refusal is a CONNACK
reason code, never an exception). Used by `SessionClient` (client.py).
"""

from __future__ import annotations

from services.common.connect import ConnectAttempt, ConnectOutcome
from services.common.mqtt.reason import ReasonCode
from services.common.subscription import identified_from_pb
from services.session.acl_codec import rule_from_pb
from starling.session.v1 import session_pb2 as pb

# CONNACK reason code of each refusal; any other refusal is Not authorized.
_REFUSALS: dict[int, ReasonCode] = {
    pb.CONNECT_RESULT_BAD_CREDENTIALS: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    pb.CONNECT_RESULT_NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    pb.CONNECT_RESULT_CLIENT_ID_INVALID: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    pb.CONNECT_RESULT_SERVER_BUSY: ReasonCode.SERVER_BUSY,
    pb.CONNECT_RESULT_QUOTA_EXCEEDED: ReasonCode.QUOTA_EXCEEDED,
    pb.CONNECT_RESULT_SERVER_UNAVAILABLE: ReasonCode.SERVER_UNAVAILABLE,
    pb.CONNECT_RESULT_BAD_AUTH_METHOD: ReasonCode.BAD_AUTHENTICATION_METHOD,
    pb.CONNECT_RESULT_BANNED: ReasonCode.BANNED,
}


def connect_request(a: ConnectAttempt) -> pb.ConnectRequest:
    req = pb.ConnectRequest(
        username=a.username,
        client_id=a.client_id,
        node_id=a.node_id,
        peer_address=a.peer_address,
        protocol_level=a.protocol_level,
        clean_start=a.clean_start,
        cert_common_name=a.cert_common_name,
        cert_subject_alt_names=a.cert_subject_alt_names,
        session_expiry_interval_s=a.session_expiry_s,
        auth_method=a.auth_method,
        auth_data=a.auth_data,
        auth_state=a.auth_state,
        will=a.will,
        will_delay_s=a.will_delay_s,
    )
    if a.password is not None:
        req.password = a.password
    return req


def connect_outcome(resp: pb.ConnectResponse) -> ConnectOutcome:
    """The session service's answer as the channel takes it."""
    if resp.result == pb.CONNECT_RESULT_CONTINUE:
        return ConnectOutcome(
            auth_continue=True, auth_data=resp.auth_data, auth_state=resp.auth_state
        )
    if resp.result == pb.CONNECT_RESULT_TAKEN_OVER:
        # A newer connection already won the race: accept, then close with 0x8E.
        return ConnectOutcome(tenant=resp.tenant, epoch=resp.epoch, taken_over=True)
    if resp.result != pb.CONNECT_RESULT_OK:
        code = _REFUSALS.get(resp.result, ReasonCode.NOT_AUTHORIZED)
        # A ban says why (a flapping ban names its setting); other refusals say nothing more.
        why = resp.reason if resp.result == pb.CONNECT_RESULT_BANNED else ""
        return ConnectOutcome(reason_code=code, reason_string=why)
    return ConnectOutcome(
        tenant=resp.tenant,
        epoch=resp.epoch,
        session_present=resp.session_present,
        acl=tuple(rule_from_pb(r) for r in resp.acl),
        acl_default_allow=resp.acl_default != pb.PERMISSION_DENY,
        incarnation=resp.incarnation,
        session_expiry_s=resp.session_expiry_interval_s,
        subscriptions=tuple(identified_from_pb(s) for s in resp.subscriptions),
        auth_data=resp.auth_data or None,
        identity=resp.username,
        awaiting_release=tuple(
            (q.packet_id, q.message_id, q.stored) for q in resp.awaiting_release
        ),
        settle_will=not resp.no_previous_session,
        qos2_fence=resp.qos2_fence,
    )


def reauth_outcome(resp: pb.ReauthenticateResponse) -> ConnectOutcome:
    """Re-authentication's answer: go on (`auth_continue`), done (ok), or the DISCONNECT
    reason code."""
    if resp.result == pb.CONNECT_RESULT_CONTINUE:
        return ConnectOutcome(
            auth_continue=True, auth_data=resp.auth_data, auth_state=resp.auth_state
        )
    if resp.result != pb.CONNECT_RESULT_OK:
        return ConnectOutcome(reason_code=_REFUSALS.get(resp.result, ReasonCode.NOT_AUTHORIZED))
    return ConnectOutcome(auth_data=resp.auth_data or None)
