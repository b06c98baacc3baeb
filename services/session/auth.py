"""Users' credentials and tenants' ACLs with a Redis cache in front of the store, and the
password check.

Hash verification (argon2 is slow by design) runs on the bounded `HashGate`, and successful
checks are remembered in-process by a digest of (tenant, user, password, hash), so a reconnect
storm costs one hash per distinct credential, not one per CONNECT. An unknown user costs the
same hash work as a known one (a decoy hash is verified), so timing does not tell them apart.

In front of Redis, in-process copies (services/session/cache.py) answer a CONNECT without a
round trip; every change of a user or an ACL drops them here and is announced
(`announce`, on `ctl.session.changed`) so that every other instance drops its copies too
(`changed`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from redis.asyncio import Redis

from services.common.acl import Access, AclRule
from services.common.store.ports_auth import AuthStore, UserRecord
from services.common.tenant_name import check_tenant
from services.session import credentials
from services.session.cache import LocalCache, Missing
from services.session.credentials import Credentials
from services.session.passwords import hash_password, verify_password
from services.session.throttle import HashGate

DEFAULT_TENANT = "default"
_MISSING = "-"
log = logging.getLogger("starling.session.auth")


def split_username(username: str) -> tuple[str, str]:
    """`tenant/name` -> (tenant, name); no slash: tenant `default`. Raises ValueError."""
    if "/" not in username:
        return DEFAULT_TENANT, username
    tenant, _, name = username.partition("/")
    check_tenant(tenant)
    return tenant, name


class Authenticator:
    def __init__(
        self,
        *,
        store: AuthStore,
        redis: Redis,
        cache_ttl_s: int,
        anonymous: list[str],
        gate: HashGate | None = None,
        local_ttl_s: float = 0.0,
        local_entries: int = 100_000,
        announce: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._redis = redis
        self._ttl = cache_ttl_s
        self._anonymous = set(anonymous)
        self._verified: dict[bytes, None] = {}
        self._max_verified = local_entries
        self._users: LocalCache[tuple[str, str], str | None] = LocalCache(
            local_ttl_s, local_entries
        )
        self._acls: LocalCache[str, tuple[AclRule, ...]] = LocalCache(local_ttl_s, local_entries)
        # Tells the other instances of a change (None: alone).
        self._announce_change = announce
        self._gate = gate or HashGate(4, 16)
        # Verified in place of a missing user's hash: same cost, never matches.
        self._decoy_hash = hash_password(secrets.token_urlsafe(24))

    def anonymous_allowed(self, tenant: str) -> bool:
        return "*" in self._anonymous or tenant in self._anonymous

    async def _user_hash(self, tenant: str, name: str) -> str | None:
        local = self._users.get((tenant, name))
        if not isinstance(local, Missing):
            return local
        generation = self._users.generation()
        value = await self._read_user_hash(tenant, name)
        self._users.put((tenant, name), value, generation)
        return value

    async def _read_user_hash(self, tenant: str, name: str) -> str | None:
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

    async def credentials(self, tenant: str, name: str) -> Credentials | None:
        """The user's stored credentials; None: no such user."""
        stored = await self._user_hash(tenant, name) if name else None
        return None if stored is None else credentials.parse(stored)

    async def check(self, tenant: str, name: str, password: bytes | None) -> bool | None:
        """True: credentials valid. False: wrong credentials. None: unknown user.
        Raises `GateFullError` when too many checks wait already."""
        if not name:
            return None
        creds = await self.credentials(tenant, name)
        if password is None:
            return None if creds is None else False
        stored = creds.password_hash if creds is not None else ""
        digest = hashlib.sha256(
            b"\0".join([tenant.encode(), name.encode(), password, stored.encode()])
        ).digest()
        if stored and digest in self._verified:
            return True
        # The same work whether the user exists or not, and whether it has a hash or not.
        ok = await self._gate.run(verify_password, stored or self._decoy_hash, password)
        if creds is None:
            return None
        if not stored:
            return False  # a SCRAM-only user: no password login
        if ok:
            if len(self._verified) >= self._max_verified:
                self._verified.clear()
            self._verified[digest] = None
        return ok

    async def acl(self, tenant: str) -> list[AclRule]:
        local = self._acls.get(tenant)
        if not isinstance(local, Missing):
            return list(local)
        generation = self._acls.generation()
        rules = await self._read_acl(tenant)
        self._acls.put(tenant, tuple(rules), generation)
        return rules

    async def _read_acl(self, tenant: str) -> list[AclRule]:
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

    async def create_user(
        self, tenant: str, name: str, password: str, scheme: str, kinds: list[str] | None = None
    ) -> None:
        """Store the password hash and/or SCRAM verifiers (`kinds`; empty: all)."""
        creds = await asyncio.to_thread(credentials.create, password, scheme, kinds or [])
        await self._store.put_user(UserRecord(tenant, name, creds.encode()))
        await self._redis.delete(f"st:user:{tenant}:{name}")
        await self._announce(_user_change(tenant, name))

    async def delete_user(self, tenant: str, name: str) -> bool:
        deleted = await self._store.delete_user(tenant, name)
        await self._redis.delete(f"st:user:{tenant}:{name}")
        await self._announce(_user_change(tenant, name))
        return deleted

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None:
        await self._store.set_acl(tenant, rules)
        await self._redis.delete(f"st:acl:{tenant}")
        await self._announce(b"acl\0" + tenant.encode())

    def changed(self, change: bytes) -> None:
        """A user or an ACL changed (here or on another instance): drop the copies of it."""
        kind, _, rest = change.partition(b"\0")
        if kind == b"acl":
            self._acls.forget(rest.decode(errors="replace"))
            return
        if kind == b"user":
            tenant, _, name = rest.decode(errors="replace").partition("\0")
            self._users.forget((tenant, name))
        else:  # unknown: from a newer version; drop everything rather than keep stale
            self._users.forget()
            self._acls.forget()
        self._verified.clear()

    async def _announce(self, change: bytes) -> None:
        self.changed(change)
        if self._announce_change is None:
            return
        try:
            await self._announce_change(change)
        except Exception as exc:  # the copies elsewhere expire with their TTL
            log.warning("auth_change_unannounced", extra={"error": type(exc).__name__})


def _user_change(tenant: str, name: str) -> bytes:
    return b"user\0" + tenant.encode() + b"\0" + name.encode()
