"""Tenant-scoped admin tokens: their format, generation and hashing.

A token reads `stk_<id>_<secret>`: `<id>` (12 hex digits) names the stored record, so a
lookup is one key read; `<secret>` is 256 random bits. Only `sha256(token)` is stored: the
secret is random, so a slow password hash would add nothing. The log scrubber
(services/common/redact.py) knows the shape and hides the secret part.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

PREFIX = "stk_"
_SHAPE = re.compile(r"^stk_([0-9a-f]{12})_([0-9a-f]{64})$")


def new_token() -> tuple[str, str]:
    """(token id, token) of a new random token."""
    token_id = secrets.token_hex(6)
    return token_id, f"{PREFIX}{token_id}_{secrets.token_hex(32)}"


def token_id_of(token: str) -> str | None:
    """The id inside a well-formed token; None for anything else."""
    m = _SHAPE.match(token)
    return m[1] if m else None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def hash_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(token_hash(token), stored_hash)
