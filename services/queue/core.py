"""Pure queue rules: partitions, ownership, expiry (queue ids: services/common/queue_entries.py)."""

from __future__ import annotations

import zlib


def partition_of(tenant: str, qid: str, partitions: int) -> int:
    return zlib.crc32(f"{tenant}\0{qid}".encode()) % partitions


def owned(partition: int, ordinal: int, count: int) -> bool:
    return partition % count == ordinal


def expires_at_ms(published_at_ms: int, expiry_interval_s: int | None) -> int:
    """0 means never."""
    return 0 if expiry_interval_s is None else published_at_ms + expiry_interval_s * 1000


class RouteVersions:
    """The version of each tenant's persistent route table that the router last fenced here.

    A connection node that chose queue entries from its own copy of the table sends that
    copy's version with the append; the append goes ahead only if it is this version. The
    router fences a new version at every queue instance before it changes the table (and
    before the SUBACK), so an append chosen from a copy older than a subscription the client
    already saw acknowledged is refused, and the node routes through the router instead.
    Unknown (e.g. after a restart): every checked append is refused until the router fences
    or appends for the tenant. One integer per tenant."""

    def __init__(self) -> None:
        self._v: dict[str, int] = {}

    def current(self, tenant: str, version: int) -> bool:
        return version != 0 and self._v.get(tenant) == version

    def learn(self, tenant: str, version: int) -> int:
        """At least `version` from now on (versions never go back); the version held."""
        held = max(self._v.get(tenant, 0), version)
        self._v[tenant] = held
        return held
