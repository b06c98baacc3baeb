"""`Limits`: a tenant's (or a user's) limits as the quota service keeps them, the one shape
its client hands out and every holder of a copy reads (services/common/limits_copies.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """A tenant's (or a user's) limits; 0 means unlimited."""

    max_connections: int = 0
    max_sessions: int = 0
    max_subscriptions_per_client: int = 0
    max_messages_per_s: int = 0
    max_bytes_in_per_s: int = 0
    max_bytes_out_per_s: int = 0
    max_queue_depth: int = 0
    max_retained_messages: int = 0
    max_retained_bytes: int = 0
    max_queued_bytes: int = 0
    max_tenant_subscriptions: int = 0
