"""Pure queue rules: partitions, ownership, queue ids, expiry."""

from __future__ import annotations

import zlib


def queue_id(client_id: str, incarnation: int) -> str:
    """A session incarnation's queue: a new session never reads an older one's entries."""
    return f"{client_id}#{incarnation}"


def partition_of(tenant: str, qid: str, partitions: int) -> int:
    return zlib.crc32(f"{tenant}\0{qid}".encode()) % partitions


def owned(partition: int, ordinal: int, count: int) -> bool:
    return partition % count == ordinal


def expires_at_ms(published_at_ms: int, expiry_interval_s: int | None) -> int:
    """0 means never."""
    return 0 if expiry_interval_s is None else published_at_ms + expiry_interval_s * 1000
