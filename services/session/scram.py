"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), server side, free of I/O.

Owns the verifier (salt, iteration count, StoredKey, ServerKey: the password itself is never
stored), its text form, and the two server steps of an exchange:
`first(client_first) -> (server_first, state)` and `final(client_final, state, verifier)`.
The state is opaque to the connection node that carries it between steps (it holds no key).
No channel binding: a gs2 header of `n,,` or `y,,` only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass

# MQTT Authentication Method -> hashlib name.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
DEFAULT_ITERATIONS = 4096  # RFC 7677's minimum for SCRAM-SHA-256
MAX_MESSAGE_BYTES = 1024  # a client-first or client-final message longer than this is refused


class ScramError(ValueError):
    """The client's message is malformed or its proof is wrong."""


@dataclass(frozen=True, slots=True)
class Verifier:
    mechanism: str  # "SCRAM-SHA-256" | "SCRAM-SHA-512"
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def encode(self) -> str:
        """`$scram-sha-256$<i>$<salt>$<StoredKey>$<ServerKey>` (standard base64)."""
        b64 = base64.b64encode
        return "$".join(
            [
                "",
                self.mechanism.lower(),
                str(self.iterations),
                b64(self.salt).decode(),
                b64(self.stored_key).decode(),
                b64(self.server_key).decode(),
            ]
        )


def parse_verifier(text: str) -> Verifier | None:
    """The verifier `text` encodes, or None when it is not one."""
    parts = text.split("$")
    if len(parts) != 6 or parts[0] or parts[1].upper() not in MECHANISMS:
        return None
    try:
        return Verifier(
            parts[1].upper(),
            int(parts[2]),
            base64.b64decode(parts[3], validate=True),
            base64.b64decode(parts[4], validate=True),
            base64.b64decode(parts[5], validate=True),
        )
    except ValueError:
        return None


def _hmac(algo: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, algo).digest()


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password, salt, iterations)


def make_verifier(
    mechanism: str,
    password: str,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> Verifier:
    algo = MECHANISMS[mechanism]
    salt = salt if salt is not None else os.urandom(16)
    salted = salted_password(mechanism, password.encode(), salt, iterations)
    client_key = _hmac(algo, salted, b"Client Key")
    return Verifier(
        mechanism,
        iterations,
        salt,
        hashlib.new(algo, client_key).digest(),
        _hmac(algo, salted, b"Server Key"),
    )


def decoy_verifier(mechanism: str, name: str, secret: bytes) -> Verifier:
    """A verifier for a user that does not exist: its salt is stable per name (derived from
    `secret`), so asking twice does not tell a made-up user from a real one; no proof
    matches it (its keys are random)."""
    algo = MECHANISMS[mechanism]
    salt = _hmac(algo, secret, name.encode())[:16]
    size = hashlib.new(algo).digest_size
    return Verifier(
        mechanism, DEFAULT_ITERATIONS, salt, secrets.token_bytes(size), secrets.token_bytes(size)
    )


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramError(f"malformed attribute {part[:20]!r}")
        out.setdefault(key, value)
    return out


def _saslname(value: str) -> str:
    """RFC 5802 5.1: `=2C` is ',' and `=3D` is '='; any other '=' is an error."""
    out = value.replace("=2C", ",").replace("=3D", "=")
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise ScramError("bad escape in user name")
    return out


@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str
    bare: str
    username: str
    nonce: str


def parse_client_first(data: bytes) -> ClientFirst:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ScramError("client-first-message too long")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ScramError("client-first-message is not UTF-8") from None
    cbind, sep1, rest = text.partition(",")
    authzid, sep2, bare = rest.partition(",")
    if not (sep1 and sep2) or cbind not in ("n", "y"):
        raise ScramError("unsupported gs2 header (no channel binding)")
    if authzid and not authzid.startswith("a="):
        raise ScramError("malformed authzid")
    attrs = _attributes(bare)
    if "m" in attrs:
        raise ScramError("mandatory extension not supported")
    if "n" not in attrs or not attrs.get("r"):
        raise ScramError("client-first-message needs n= and r=")
    return ClientFirst(f"{cbind},{authzid},", bare, _saslname(attrs["n"]), attrs["r"])


def first(mechanism: str, client: ClientFirst, verifier: Verifier) -> tuple[bytes, bytes]:
    """Server-first-message and the state for `final`."""
    nonce = client.nonce + secrets.token_urlsafe(18)
    server_first = f"r={nonce},s={base64.b64encode(verifier.salt).decode()},i={verifier.iterations}"
    state = {
        "m": mechanism,
        "g": client.gs2_header,
        "b": client.bare,
        "s": server_first,
        "r": nonce,
    }
    return server_first.encode(), json.dumps(state).encode()


@dataclass(frozen=True, slots=True)
class Exchange:
    """The state `first` returned, read back."""

    mechanism: str
    gs2_header: str
    client_first_bare: str
    server_first: str
    nonce: str

    @property
    def username(self) -> str:
        """The user name of the client-first-message."""
        return _saslname(_attributes(self.client_first_bare)["n"])


def read_state(state: bytes) -> Exchange:
    try:
        s = json.loads(state)
        exchange = Exchange(s["m"], s["g"], s["b"], s["s"], s["r"])
    except (ValueError, KeyError, TypeError):
        raise ScramError("bad exchange state") from None
    if exchange.mechanism not in MECHANISMS:
        raise ScramError("bad exchange state")
    return exchange


def final(client_final: bytes, exchange: Exchange, verifier: Verifier) -> bytes:
    """Check the client's proof against `verifier`: the server-final-message (`v=...`), or
    ScramError. Compares in constant time."""
    if len(client_final) > MAX_MESSAGE_BYTES:
        raise ScramError("client-final-message too long")
    try:
        text = client_final.decode()
    except UnicodeDecodeError:
        raise ScramError("client-final-message is not UTF-8") from None
    without_proof, sep, proof_part = text.rpartition(",p=")
    if not sep:
        raise ScramError("client-final-message has no proof")
    attrs = _attributes(without_proof)
    expected_c = base64.b64encode(exchange.gs2_header.encode()).decode()
    if attrs.get("c") != expected_c:
        raise ScramError("channel binding mismatch")
    if attrs.get("r") != exchange.nonce:
        raise ScramError("nonce mismatch")
    try:
        proof = base64.b64decode(proof_part, validate=True)
    except ValueError:
        raise ScramError("proof is not base64") from None
    algo = MECHANISMS[exchange.mechanism]
    auth_message = f"{exchange.client_first_bare},{exchange.server_first},{without_proof}".encode()
    signature = _hmac(algo, verifier.stored_key, auth_message)
    if len(proof) != len(signature):
        raise ScramError("invalid proof")
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    if not hmac.compare_digest(hashlib.new(algo, client_key).digest(), verifier.stored_key):
        raise ScramError("invalid proof")
    server_signature = _hmac(algo, verifier.server_key, auth_message)
    return b"v=" + base64.b64encode(server_signature)
