"""The router store's port (`RouterStore`): retained messages and delayed publishes, kept by
the router. Every backend passes the contract tests in tests/common/test_store_contract_router.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RetainedRecord:
    tenant: str
    topic: str
    data: bytes  # serialized starling.common.v1.RoutedMessage
    expires_at_ms: int = 0  # 0: never


@dataclass(frozen=True, slots=True)
class DelayedRecord:
    id: str
    tenant: str
    due_ms: int
    data: bytes  # serialized RoutedMessage, topic already without the $delayed prefix


class RouterStore(Protocol):
    """Retained messages and delayed publishes (owned by the router)."""

    async def put_retained(self, rec: RetainedRecord) -> None: ...

    async def delete_retained(self, tenant: str, topic: str) -> bool: ...

    async def all_retained(self) -> list[RetainedRecord]: ...

    async def tenant_retained(self, tenant: str) -> list[RetainedRecord]:
        """One tenant's retained messages (a router of several instances reloads them)."""
        ...

    async def put_delayed(self, rec: DelayedRecord) -> None: ...

    async def delete_delayed(self, tenant: str, id: str) -> bool: ...

    async def all_delayed(self) -> list[DelayedRecord]: ...

    async def close(self) -> None: ...
