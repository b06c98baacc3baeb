"""The ban store's port (`BanStore`): the ban list, written by the quota service and read by
nodes and session services. Every backend passes the contract tests in
tests/common/test_store_contract_bans.py.
"""

from __future__ import annotations

from typing import Protocol

from services.common.bans import Ban, BanKind


class BanStore(Protocol):
    """The ban list, written by the quota service (every instance sees the same list) and
    read by nodes and session services through it. Expired bans are never listed."""

    async def put(self, ban: Ban, max_bans: int) -> bool:
        """Add or replace `ban`; False (nothing written) when it is new and `max_bans` bans
        are in force."""

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        """True when the ban existed."""

    async def list(self) -> list[Ban]:
        """Every ban in force, oldest first."""

    async def close(self) -> None: ...
