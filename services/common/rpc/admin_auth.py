"""Who may call an admin RPC, and on which tenant.

Two kinds of caller: the operator (the `admin_token` setting) administers every tenant; a
tenant-scoped token (services/common/admin_tokens.py, kept by the session service) administers
the one tenant it was created for. `tenant_of(request)` finds the tenant an admin request
names (its `tenant` field, or that of a message field such as CreateRuleRequest.rule); a
request that names none spans every tenant and is the operator's alone.

Services other than session resolve tenant tokens through the session service
(`TokenService.ResolveAdminToken`) behind `CachedTokenResolver`, so a burst of admin calls is
one lookup, and a revocation takes effect within `admin_token_cache_s` everywhere.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from services.common.admin_tokens import token_hash


@dataclass(frozen=True, slots=True)
class TenantGrant:
    """What a valid tenant token allows: administering `tenant` until `expires_at_ms`."""

    tenant: str
    token_id: str
    expires_at_ms: int = 0  # 0: never

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms != 0 and now_ms >= self.expires_at_ms


class TokenResolver(Protocol):
    async def resolve(self, token: str) -> TenantGrant | None:
        """The grant of a valid tenant token; None when unknown, revoked or expired.
        Raises when the answer cannot be had (the session service is down)."""


class CachedTokenResolver:
    """Remembers answers (valid or not) of `lookup` for `ttl_s`, keyed by the token's hash,
    at most `max_entries` of them (oldest dropped first), so guessing tokens cannot grow it."""

    def __init__(
        self,
        lookup: Callable[[str], Awaitable[TenantGrant | None]],
        ttl_s: float,
        max_entries: int = 4096,
    ) -> None:
        self._lookup = lookup
        self._ttl_s = ttl_s
        self._max = max_entries
        self._cache: OrderedDict[str, tuple[float, TenantGrant | None]] = OrderedDict()

    async def resolve(self, token: str) -> TenantGrant | None:
        key = token_hash(token)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        grant = await self._lookup(token)
        if self._ttl_s > 0:
            self._cache[key] = (now + self._ttl_s, grant)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return grant


def tenant_of(request: Message) -> str | None:
    """The tenant an admin request acts on; None if it names none (acts on every tenant)."""
    fields = request.DESCRIPTOR.fields_by_name
    tenant = fields.get("tenant")
    if tenant is not None and tenant.type == FieldDescriptor.TYPE_STRING:
        return str(getattr(request, "tenant"))  # noqa: B009 - any message type
    for field in request.DESCRIPTOR.fields:
        inner = field.message_type
        if inner is not None and not field.is_repeated and "tenant" in inner.fields_by_name:
            return str(getattr(request, field.name).tenant)
    return None
