"""Storage interfaces shared by services. Every backend (embedded SQLite, Cassandra) passes the
same contract tests in tests/common/test_store_contract.py.
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
