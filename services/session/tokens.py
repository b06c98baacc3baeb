"""Tenant-scoped admin tokens of the session service: create (random, stored as SHA-256 with
an expiry), list, revoke, and resolve a presented token to the tenant it administers.

The session service's own admin interceptor resolves through `AdminTokens` directly (no
cache: a revocation is immediate here); the other services ask through `TokenService`
(services/session/token_api.py) and cache answers for `admin_token_cache_s`.
"""

from __future__ import annotations

import logging

from services.common.admin_tokens import hash_matches, new_token, token_hash, token_id_of
from services.common.clock import now_ms
from services.common.rpc.admin_auth import TenantGrant
from services.common.rpc.errors import InvalidArgumentError, ResourceExhaustedError
from services.common.store.ports_auth import AdminTokenRecord, AdminTokenStore
from services.common.tenant_name import check_tenant

log = logging.getLogger(__name__)


class AdminTokens:
    def __init__(self, store: AdminTokenStore, max_ttl_s: int, max_per_tenant: int) -> None:
        self._store = store
        self._max_ttl_s = max_ttl_s
        self._max_per_tenant = max_per_tenant

    async def create(
        self, tenant: str, ttl_s: int, description: str = ""
    ) -> tuple[AdminTokenRecord, str]:
        """A new token for `tenant` valid `ttl_s` seconds: (its record, the token itself)."""
        try:
            check_tenant(tenant)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if not 0 < ttl_s <= self._max_ttl_s:
            raise InvalidArgumentError(
                f"ttl_s must be 1..{self._max_ttl_s} (admin_token_max_ttl_s), got {ttl_s}"
            )
        if len(description) > 200:
            raise InvalidArgumentError("description is longer than 200 characters")
        now = now_ms()
        live = [r for r in await self._store.list_tokens(tenant) if not r.expired(now)]
        if len(live) >= self._max_per_tenant:
            raise ResourceExhaustedError(
                f"tenant {tenant!r} has {len(live)} live admin tokens, the limit "
                f"(admin_tokens_per_tenant_max); revoke one first"
            )
        token_id, token = new_token()
        record = AdminTokenRecord(
            token_id, tenant, token_hash(token), now, now + ttl_s * 1000, description
        )
        await self._store.put_token(record)
        log.info(
            "admin_token_created",
            extra={"token_id": token_id, "tenant": tenant, "expires_at_ms": record.expires_at_ms},
        )
        return record, token

    async def list(self, tenant: str | None = None) -> list[AdminTokenRecord]:
        return await self._store.list_tokens(tenant)

    async def revoke(self, token_id: str) -> bool:
        revoked = await self._store.delete_token(token_id)
        log.info("admin_token_revoked", extra={"token_id": token_id, "revoked": revoked})
        return revoked

    async def resolve(self, token: str) -> TenantGrant | None:
        """The grant of a valid token; None when malformed, unknown, revoked or expired."""
        token_id = token_id_of(token)
        if token_id is None:
            return None
        record = await self._store.get_token(token_id)
        if record is None or not hash_matches(token, record.token_hash):
            return None
        if record.expired(now_ms()):
            return None
        return TenantGrant(record.tenant, record.token_id, record.expires_at_ms)
