"""Pure session rules: resume or start over, what a disconnect does to a session, and who
may use a client id."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.store.ports_session import NEVER_EXPIRES, SessionRecord


@dataclass(frozen=True, slots=True)
class SessionDecision:
    present: bool
    incarnation: int
    # The previous incarnation to discard (its subscriptions and queue), if any.
    discard: SessionRecord | None
    # Whether to keep a record at all (a clean, non-persistent session needs none).
    persist: bool


def expired(rec: SessionRecord, now_ms: int) -> bool:
    at = rec.expires_at_ms()
    return at is not None and at <= now_ms


def decide(
    rec: SessionRecord | None, clean_start: bool, expiry_s: int, now_us: int
) -> SessionDecision:
    """[MQTT-3.1.2-4..6] Clean Start discards an existing session; otherwise a session that
    has not expired is resumed (session present). A new session gets a fresh incarnation,
    so it never reads an older incarnation's queue."""
    now_ms = now_us // 1000
    if rec is not None and not clean_start and not expired(rec, now_ms):
        return SessionDecision(True, rec.incarnation, None, True)
    incarnation = max(now_us, rec.incarnation + 1) if rec is not None else now_us
    return SessionDecision(False, incarnation, rec, expiry_s > 0)


def may_use(owner: str | None, user: str) -> bool:
    """Whether `user` (its authenticated name, "" for an anonymous client) may take over a
    client id whose session or connection belongs to `owner` (None: unknown, so anyone).
    Anonymous clients are one identity: they may take over one another's client ids, never
    a user's, and a user never an anonymous client's."""
    return owner is None or owner == user


def requested_expiry(protocol_level: int, clean_start: bool, expiry_s: int | None) -> int:
    """Session expiry a CONNECT asks for: MQTT 5 property (absent: 0); 3.1.1 clean session
    0 means the session never expires, clean session 1 means it ends with the connection."""
    if protocol_level == 5:
        return expiry_s or 0
    return 0 if clean_start else NEVER_EXPIRES
