"""Who is calling the HTTP API, and as which tenant: an `Authorization` header to a `Caller`,
or `CallerError` with the HTTP status and reason of the refusal.

- `Bearer <operator token>`: every tenant; the request names one (`tenant`). No ACL.
- `Bearer <tenant admin token>` (`starling admin token create --tenant acme`): that tenant
  only, resolved through the session service (services/session/token_client.py) and
  remembered for `admin_token_cache_s`. A `tenant` field naming another tenant: 403. No ACL.
- `Basic <user:password>`: an MQTT user (`tenant/name`) logs in as a client would CONNECT
  (the session service's authenticators, bans, back-off), and its ACL decides each topic.
  The session service's answer is remembered for `gateway_auth_cache_s`, keyed by a hash
  of the credentials; a refusal is not remembered. Each check opens and at once releases a
  registry entry `http-<random>` on the gateway's node id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from services.common.acl import AclChecker
from services.common.rpc.admin_auth import TokenResolver
from services.gateway.presence import LoginRefusedError, Presence

log = logging.getLogger("starling.gateway.callers")


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str  # "" for the operator: the request names the tenant
    identity: str  # the publisher as downstream sees it
    acl: AclChecker | None  # None: an admin token, every topic of its tenant


class CallerError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LoginCache:
    ttl_s: float
    max_entries: int


class Callers:
    def __init__(
        self,
        *,
        operator_token: str,
        tokens: TokenResolver,
        presence: Presence,
        cache: LoginCache,
    ) -> None:
        self._operator = operator_token
        self._tokens = tokens
        self._presence = presence
        self._cache = cache
        self._logins: OrderedDict[bytes, tuple[float, Caller]] = OrderedDict()

    async def caller(self, authorization: str, peer: str) -> Caller:
        scheme, _, credentials = authorization.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and credentials.strip():
            return await self._bearer(credentials.strip())
        if scheme == "basic" and credentials.strip():
            return await self._basic(credentials.strip(), peer)
        raise CallerError(401, "an Authorization header (Bearer token or Basic) is required")

    async def _bearer(self, token: str) -> Caller:
        if self._operator and hmac.compare_digest(token.encode(), self._operator.encode()):
            return Caller("", "operator", None)
        try:
            grant = await self._tokens.resolve(token)
        except Exception as exc:
            log.warning("token_resolution_failed", extra={"error": type(exc).__name__})
            raise CallerError(503, "the session service did not answer") from None
        if grant is None or grant.expired(int(time.time() * 1000)):
            raise CallerError(401, "unknown, revoked or expired token")
        return Caller(grant.tenant, f"token:{grant.token_id}", None)

    async def _basic(self, credentials: str, peer: str) -> Caller:
        try:
            text = base64.b64decode(credentials, validate=True).decode()
        except (binascii.Error, ValueError):
            raise CallerError(401, "Basic credentials are not base64 of user:password") from None
        username, sep, password = text.partition(":")
        if not sep or not username:
            raise CallerError(401, "Basic credentials need user:password")
        key = hashlib.sha256(text.encode()).digest()
        now = time.monotonic()
        hit = self._logins.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        caller = await self._login(username, password, peer)
        if self._cache.ttl_s > 0:
            self._logins[key] = (now + self._cache.ttl_s, caller)
            self._logins.move_to_end(key)
            while len(self._logins) > self._cache.max_entries:
                self._logins.popitem(last=False)
        return caller

    async def _login(self, username: str, password: str, peer: str) -> Caller:
        client_id = f"http-{secrets.token_hex(8)}"
        try:
            outcome = await self._presence.login(
                client_id=client_id, username=username, password=password.encode(), peer=peer
            )
        except LoginRefusedError as refused:
            raise CallerError(refused.status, refused.reason) from None
        await self._presence.release(outcome.tenant, client_id, outcome)
        acl = AclChecker(list(outcome.acl), outcome.acl_default_allow)
        return Caller(outcome.tenant, outcome.identity or username, acl)
