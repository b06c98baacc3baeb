"""Who a CONNECT (or a re-authentication) is: back-off first, then SCRAM when the client
named an authentication method, else the tenant's authenticator chain, else anonymous access.

The tenant is the one the user name names (`tenant/name`), else the one the client
certificate's identity names, else `default`; its chain (setting `auth_chain`) decides. Every
refusal for a wrong credential counts against the user name and the peer's IP address
(throttle.py); a backed-off client is refused with 0x89 before any hash work.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.acl import AclRule
from services.common.mqtt.reason import ReasonCode as RC
from services.session.auth import Authenticator as Users
from services.session.auth import split_username
from services.session.authenticators.cert import cert_identity
from services.session.authenticators.chain import Chains
from services.session.enhanced import CONTINUE, EnhancedAuth, Step, supported
from services.session.throttle import AuthThrottle
from services.session.verdict import Decision, Presented
from starling.session.v1 import session_pb2 as pb

# Failures that say something about the credential (not: busy, unavailable, bad method).
_GUESSES = (RC.BAD_USER_NAME_OR_PASSWORD, RC.NOT_AUTHORIZED)


@dataclass(frozen=True, slots=True)
class Admission:
    """code 0: admitted as `tenant`/`name` with extra `acl` rules first; CONTINUE: send
    `auth_data` in AUTH 0x18; anything else: the CONNACK reason code of the refusal."""

    code: int
    tenant: str = ""
    name: str = ""
    acl: tuple[AclRule, ...] = ()
    auth_data: bytes = b""
    auth_state: bytes = b""
    reason: str = ""
    authenticated: bool = False  # a credential proved `name` (False: anonymous access)


def _refused(code: int, reason: str) -> Admission:
    return Admission(code, reason=reason)


class Login:
    def __init__(
        self,
        users: Users,
        chains: Chains,
        enhanced: EnhancedAuth,
        throttle: AuthThrottle,
        cert_source: str,
    ) -> None:
        self._users = users
        self._chains = chains
        self._enhanced = enhanced
        self._throttle = throttle
        self._cert_source = cert_source

    async def connect(self, r: pb.ConnectRequest) -> Admission:
        sans = tuple(r.cert_subject_alt_names)
        source = r.username or cert_identity(self._cert_source, r.cert_common_name, sans)
        try:
            tenant, name = split_username(source)
        except ValueError as exc:
            return _refused(RC.BAD_USER_NAME_OR_PASSWORD, str(exc))
        user_key = f"{tenant}/{name}" if name else ""
        if self._throttle.refused_now(user_key, r.peer_address):
            return _refused(RC.SERVER_BUSY, "too many failed logins; retry later")
        if r.auth_method:
            return await self._enhanced_step(r.username, r.peer_address, r)
        password = r.password if r.HasField("password") else None
        presented = Presented(
            tenant,
            name,
            r.username,
            password,
            r.client_id,
            r.peer_address,
            r.cert_common_name,
            sans,
            "/" in source,
        )
        verdict = await self._chains.authenticate(presented)
        if verdict.decision is Decision.ALLOW:
            self._throttle.succeeded(user_key)
            return Admission(
                0, verdict.tenant or tenant, verdict.name or name, verdict.acl, authenticated=True
            )
        if verdict.decision is Decision.DENY:
            # Not a transient refusal (an auth service down, with on_timeout "deny").
            if verdict.reason_code in _GUESSES and verdict.cacheable:
                self._throttle.failed(user_key, r.peer_address)
            return _refused(verdict.reason_code, verdict.reason)
        if self._users.anonymous_allowed(tenant):
            return Admission(0, tenant, name)
        if name or password is not None:
            self._throttle.failed(user_key, r.peer_address)
        code = RC.BAD_USER_NAME_OR_PASSWORD if name else RC.NOT_AUTHORIZED
        return _refused(code, "anonymous access is off for tenant")

    async def reauthenticate(self, r: pb.ReauthenticateRequest) -> Admission:
        if self._throttle.refused_now(r.username, r.peer_address):
            return _refused(RC.SERVER_BUSY, "too many failed logins; retry later")
        admission = await self._enhanced_step(r.username, r.peer_address, r)
        if admission.code == 0 and admission.tenant != r.tenant:
            return _refused(RC.NOT_AUTHORIZED, "re-authenticated as another tenant")
        return admission

    async def _enhanced_step(
        self, username: str, peer: str, r: pb.ConnectRequest | pb.ReauthenticateRequest
    ) -> Admission:
        step: Step = await self._enhanced.step(username, r.auth_method, r.auth_data, r.auth_state)
        if step.code != RC.BAD_AUTHENTICATION_METHOD and step.tenant:
            if "scram" not in self._chains.names(step.tenant) or not supported(r.auth_method):
                return _refused(RC.BAD_AUTHENTICATION_METHOD, "SCRAM is off for this tenant")
        user_key = f"{step.tenant}/{step.name}" if step.name else ""
        if step.failed:
            if step.code in _GUESSES:
                self._throttle.failed(user_key, peer)
            return _refused(step.code, step.reason)
        if step.code == CONTINUE:
            return Admission(CONTINUE, step.tenant, step.name, (), step.data, step.state)
        self._throttle.succeeded(user_key)
        return Admission(0, step.tenant, step.name, (), step.data, authenticated=True)
