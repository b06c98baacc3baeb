"""The identity of a client certificate the TLS handshake verified (mTLS), as the session
service's certificate authenticator reads it: the subject's common name and the subject
alternative names (`DNS:x`, `email:y`, `URI:z`, `IP:a`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_SAN_KINDS = {"DNS": "DNS", "email": "email", "URI": "URI", "IP Address": "IP"}


@dataclass(frozen=True, slots=True)
class PeerCert:
    common_name: str
    alt_names: tuple[str, ...] = ()


def peer_cert(info: Any) -> PeerCert | None:
    """From `ssl.SSLObject.getpeercert()` (a dict; empty or None when the client sent no
    certificate, and the handshake refuses one that does not verify)."""
    if not info:
        return None
    common_name = ""
    for rdn in info.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                common_name = value
    alt_names = tuple(
        f"{_SAN_KINDS[kind]}:{value}"
        for kind, value in info.get("subjectAltName", ())
        if kind in _SAN_KINDS
    )
    return PeerCert(common_name, alt_names)
