"""The client side of SCRAM-SHA-256/512 (RFC 5802), written apart from the server's code so
the tests check one against the other."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

_ALGOS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class ScramClient:
    """`first()`, then `final(server_first)`, then `verify(server_final)`."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str = "") -> None:
        self.mechanism = mechanism
        self._algo = _ALGOS[mechanism]
        self._password = password.encode()
        name = username.replace("=", "=3D").replace(",", "=2C")
        self._bare = f"n={name},r={nonce or secrets.token_urlsafe(18)}"
        self._auth_message = b""
        self._server_key = b""

    def first(self) -> bytes:
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        attrs = dict(part.split("=", 1) for part in server_first.decode().split(","))
        salt, iterations = base64.b64decode(attrs["s"]), int(attrs["i"])
        salted = hashlib.pbkdf2_hmac(self._algo, self._password, salt, iterations)
        client_key = hmac.new(salted, b"Client Key", self._algo).digest()
        stored_key = hashlib.new(self._algo, client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        self._auth_message = f"{self._bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, self._auth_message, self._algo).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = hmac.new(salted, b"Server Key", self._algo).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        expected = hmac.new(self._server_key, self._auth_message, self._algo).digest()
        return server_final == b"v=" + base64.b64encode(expected)
