"""Password hashing: argon2id (default) and bcrypt, recognised by their hash prefix."""

from __future__ import annotations

import bcrypt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_argon = PasswordHasher()


def hash_password(password: str, scheme: str = "argon2") -> str:
    if scheme in ("", "argon2"):
        return _argon.hash(password)
    if scheme == "bcrypt":
        return bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    raise ValueError(f"unknown hash scheme {scheme!r}; expected 'argon2' or 'bcrypt'")


def verify_password(stored_hash: str, password: bytes) -> bool:
    """Constant-time check of `password` against an argon2 or bcrypt hash."""
    if stored_hash.startswith("$argon2"):
        try:
            return bool(_argon.verify(stored_hash, password))
        except (VerificationError, InvalidHashError):
            return False
    if stored_hash.startswith(("$2a$", "$2b$", "$2y$")):
        try:
            return bcrypt.checkpw(password, stored_hash.encode())
        except ValueError:
            return False
    return False
