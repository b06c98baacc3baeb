"""A user's stored credentials: a password hash and/or SCRAM verifiers, in one text.

The store keeps one opaque text per user (`UserRecord.password_hash`); this module owns its
format: space-separated entries, each a password hash (`$argon2...`, `$2b$...`) or a SCRAM
verifier (`$scram-sha-256$...`, `$scram-sha-512$...`). None of these encodings contains a
space, and a text written before SCRAM existed (one hash) reads back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.session.passwords import hash_password
from services.session.scram import MECHANISMS, Verifier, make_verifier, parse_verifier

HASH = "hash"
KINDS = (HASH, "scram-sha-256", "scram-sha-512")


@dataclass(frozen=True, slots=True)
class Credentials:
    password_hash: str = ""  # empty: no password login (SCRAM only)
    scram: dict[str, Verifier] = field(default_factory=dict)  # by mechanism

    def encode(self) -> str:
        entries = [self.password_hash] if self.password_hash else []
        entries += [self.scram[m].encode() for m in sorted(self.scram)]
        return " ".join(entries)


def parse(text: str) -> Credentials:
    password_hash = ""
    scram: dict[str, Verifier] = {}
    for entry in text.split():
        verifier = parse_verifier(entry)
        if verifier is not None:
            scram[verifier.mechanism] = verifier
        elif not password_hash:
            password_hash = entry
    return Credentials(password_hash, scram)


def check_kinds(kinds: list[str]) -> list[str]:
    """The kinds to store (all when `kinds` is empty); ValueError names an unknown one."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown credential {kind!r}; expected one of {', '.join(KINDS)}")
    return list(kinds) or list(KINDS)


def create(password: str, scheme: str, kinds: list[str]) -> Credentials:
    """Hash and/or SCRAM verifiers of `password` (slow: call from a worker thread)."""
    kinds = check_kinds(kinds)
    return Credentials(
        hash_password(password, scheme) if HASH in kinds else "",
        {m: make_verifier(m, password) for m in MECHANISMS if m.lower() in kinds},
    )
