"""Authentication and ACL lookup with a Redis cache in front of the store.

Hash verification (argon2 is slow by design) runs in a worker thread, and successful checks are
remembered in-process by a digest of (tenant, user, password, hash), so a reconnect storm costs
one hash per distinct credential, not one per CONNECT.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import asdict

from redis.asyncio import Redis

from services.common.acl import Access, AclRule
from services.common.store.ports import AuthStore, UserRecord
from services.session.passwords import hash_password, verify_password

DEFAULT_TENANT = "default"
_TENANT_RE = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
_MISSING = "-"


def split_username(username: str) -> tuple[str, str]:
    """`tenant/name` -> (tenant, name); no slash: tenant `default`. Raises ValueError."""
    if "/" not in username:
        return DEFAULT_TENANT, username
    tenant, _, name = username.partition("/")
    check_tenant(tenant)
    return tenant, name


def check_tenant(tenant: str) -> None:
    if not _TENANT_RE.match(tenant):
        raise ValueError(f"invalid tenant name {tenant!r}: 1-64 of [A-Za-z0-9_-]")


class Authenticator:
    def __init__(
        self, store: AuthStore, redis: Redis, cache_ttl_s: int, anonymous: list[str]
    ) -> None:
        self._store = store
        self._redis = redis
        self._ttl = cache_ttl_s
        self._anonymous = set(anonymous)
        self._verified: dict[bytes, None] = {}

    def anonymous_allowed(self, tenant: str) -> bool:
        return "*" in self._anonymous or tenant in self._anonymous

    async def _user_hash(self, tenant: str, name: str) -> str | None:
        key = f"st:user:{tenant}:{name}"
        if self._ttl:
            cached = await self._redis.get(key)
            if cached is not None:
                value = cached.decode()
                return None if value == _MISSING else value
        user = await self._store.get_user(tenant, name)
        if self._ttl:
            await self._redis.set(key, user.password_hash if user else _MISSING, ex=self._ttl)
        return user.password_hash if user else None

    async def check(self, tenant: str, name: str, password: bytes | None) -> bool | None:
        """True: credentials valid. False: wrong credentials. None: unknown user."""
        if not name:
            return None
        stored = await self._user_hash(tenant, name)
        if stored is None:
            return None
        if password is None:
            return False
        digest = hashlib.sha256(
            b"\0".join([tenant.encode(), name.encode(), password, stored.encode()])
        ).digest()
        if digest in self._verified:
            return True
        ok = await asyncio.to_thread(verify_password, stored, password)
        if ok:
            if len(self._verified) > 100_000:
                self._verified.clear()
            self._verified[digest] = None
        return ok

    async def acl(self, tenant: str) -> list[AclRule]:
        key = f"st:acl:{tenant}"
        if self._ttl:
            cached = await self._redis.get(key)
            if cached is not None:
                return [
                    AclRule(
                        r["allow"],
                        Access(r["access"]),
                        r["topic_filter"],
                        r["username"],
                        r["client_id"],
                    )
                    for r in json.loads(cached)
                ]
        rules = await self._store.get_acl(tenant)
        if self._ttl:
            await self._redis.set(key, json.dumps([asdict(r) for r in rules]), ex=self._ttl)
        return rules

    async def create_user(self, tenant: str, name: str, password: str, scheme: str) -> None:
        hashed = await asyncio.to_thread(hash_password, password, scheme)
        await self._store.put_user(UserRecord(tenant, name, hashed))
        await self._redis.delete(f"st:user:{tenant}:{name}")

    async def delete_user(self, tenant: str, name: str) -> bool:
        deleted = await self._store.delete_user(tenant, name)
        await self._redis.delete(f"st:user:{tenant}:{name}")
        self._verified.clear()
        return deleted

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None:
        await self._store.set_acl(tenant, rules)
        await self._redis.delete(f"st:acl:{tenant}")
