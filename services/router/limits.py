"""Per-tenant caps on what the router stores for a tenant (retained messages, pending
`$delayed` messages), and the usage they are checked against.

Usage is derived from the store when the router starts (every record is loaded), so a cap
holds across restarts. Only growth is ever refused: deleting a retained message, replacing
one with a smaller one, or a delayed message becoming due always goes through, so a tenant
over a lowered cap can always get back under it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caps:
    """0: no cap."""

    retained_messages: int = 0
    retained_bytes: int = 0
    delayed_messages: int = 0
    delayed_bytes: int = 0


def fits(
    count: int, size: int, add_count: int, add_bytes: int, max_count: int, max_bytes: int
) -> bool:
    """Whether holding `add_count` more messages of `add_bytes` more bytes keeps a tenant
    (now at `count` messages, `size` bytes) within its caps. A change that does not grow
    either figure always fits."""
    if add_count <= 0 and add_bytes <= 0:
        return True
    if max_count and add_count > 0 and count + add_count > max_count:
        return False
    return not (max_bytes and add_bytes > 0 and size + add_bytes > max_bytes)


class Usage:
    """Messages and bytes each tenant holds of one kind."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        return self._count.get(tenant, 0)

    def size(self, tenant: str) -> int:
        return self._bytes.get(tenant, 0)

    def add(self, tenant: str, nbytes: int) -> None:
        self._count[tenant] = self._count.get(tenant, 0) + 1
        self._bytes[tenant] = self._bytes.get(tenant, 0) + nbytes

    def remove(self, tenant: str, nbytes: int) -> None:
        left = self._count.get(tenant, 0) - 1
        if left <= 0:
            self._count.pop(tenant, None)
            self._bytes.pop(tenant, None)
            return
        self._count[tenant] = left
        self._bytes[tenant] = self._bytes.get(tenant, 0) - nbytes
