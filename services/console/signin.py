"""Who is signed in to the console, and for how long.

A sign-in presents the operator token (every tenant) or a tenant-scoped admin token (one
tenant, resolved by the session service's token client, as every service resolves them).
A session is a random id in an HttpOnly, SameSite=Strict cookie; the record it names lives
in Redis (so every console instance knows it) under the id's SHA-256, with the token the
console calls the admin APIs with, the session's CSRF token and its expiry. Sign-in attempts
are counted per client address and minute in Redis, across every instance.

Invariants: a session never outlives the tenant token it was made from; the cookie holds
nothing but the id; a record is found only by the hash of an id that was handed out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass

from redis.asyncio import Redis

from services.common.clock import now_ms
from services.session.token_client import TokenClient

COOKIE = "starling_console"
SIGN_IN_COOKIE = "starling_console_signin"  # double-submit CSRF token of the sign-in form
_SESSION_KEY = "console:session:"
_ATTEMPTS_KEY = "console:signin:"


@dataclass(frozen=True, slots=True)
class Principal:
    """A signed-in person: `tenant` "" is the operator (every tenant)."""

    token: str
    tenant: str
    name: str
    csrf: str
    expires_at_ms: int

    @property
    def operator(self) -> bool:
        return not self.tenant


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def same(a: str, b: str) -> bool:
    """Constant-time equality of two secrets (an empty one never matches)."""
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


class Sessions:
    """Sign-in, the sessions it makes, and the per-address limit on attempts."""

    def __init__(
        self,
        *,
        redis: Redis,
        tokens: TokenClient,
        operator_token: str,
        ttl_s: int,
        attempts_per_minute: int,
    ) -> None:
        self._redis = redis
        self._tokens = tokens
        self._operator_token = operator_token
        self._ttl_s = ttl_s
        self._attempts = attempts_per_minute

    async def allow_attempt(self, address: str) -> bool:
        """Count one sign-in attempt of `address`; False once it made too many this minute."""
        key = f"{_ATTEMPTS_KEY}{address}:{int(time.time() // 60)}"
        count = await self._redis.incr(key)
        if count == 1:
            await self._redis.expire(key, 120)
        return int(count) <= self._attempts

    async def principal_of(self, token: str) -> Principal | None:
        """Who `token` makes you, or None for a wrong (unknown, revoked, expired) one."""
        token = token.strip()
        if not token:
            return None
        expires = now_ms() + self._ttl_s * 1000
        if same(token, self._operator_token):
            return Principal(token, "", "operator", new_secret(), expires)
        grant = await self._tokens.resolve(token)
        if grant is None or grant.expired(now_ms()):
            return None
        if grant.expires_at_ms:
            expires = min(expires, grant.expires_at_ms)
        name = f"tenant {grant.tenant} (token {grant.token_id})"
        return Principal(token, grant.tenant, name, new_secret(), expires)

    async def open(self, principal: Principal) -> str:
        """Store the session; returns the id the cookie carries."""
        sid = new_secret()
        ttl_ms = max(1000, principal.expires_at_ms - now_ms())
        await self._redis.set(_key(sid), json.dumps(asdict(principal)), px=ttl_ms)
        return sid

    async def find(self, sid: str) -> Principal | None:
        if not sid:
            return None
        raw = await self._redis.get(_key(sid))
        if raw is None:
            return None
        principal = Principal(**json.loads(raw))
        return principal if principal.expires_at_ms > now_ms() else None

    async def close(self, sid: str) -> None:
        if sid:
            await self._redis.delete(_key(sid))

    @property
    def ttl_s(self) -> int:
        return self._ttl_s


def _key(sid: str) -> str:
    return _SESSION_KEY + hashlib.sha256(sid.encode()).hexdigest()
