"""The credential stores' ports, kept by the session service: users and ACLs per tenant
(`AuthStore`) and tenant-scoped admin tokens (`AdminTokenStore`). Every backend passes the
contract tests in tests/common/test_store_contract.py and test_store_contract_tokens.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.common.acl import AclRule


@dataclass(frozen=True, slots=True)
class UserRecord:
    tenant: str
    username: str
    password_hash: str


class AuthStore(Protocol):
    """Users and ACLs per tenant."""

    async def get_user(self, tenant: str, username: str) -> UserRecord | None: ...

    async def put_user(self, user: UserRecord) -> None: ...

    async def delete_user(self, tenant: str, username: str) -> bool: ...

    async def get_acl(self, tenant: str) -> list[AclRule]: ...

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AdminTokenRecord:
    """A tenant-scoped admin token as stored: its SHA-256, never the token itself."""

    token_id: str
    tenant: str
    token_hash: str
    created_at_ms: int
    expires_at_ms: int = 0  # 0: never
    description: str = ""

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms != 0 and now_ms >= self.expires_at_ms


class AdminTokenStore(Protocol):
    """Tenant-scoped admin tokens (issue 12), kept by the session service."""

    async def put_token(self, record: AdminTokenRecord) -> None: ...

    async def get_token(self, token_id: str) -> AdminTokenRecord | None: ...

    async def list_tokens(self, tenant: str | None = None) -> list[AdminTokenRecord]:
        """Every token, or those of `tenant`, ordered by creation."""

    async def delete_token(self, token_id: str) -> bool: ...

    async def close(self) -> None: ...
