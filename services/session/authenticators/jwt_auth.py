"""JWT passed as the MQTT password (PyJWT): HS256/384/512 with a shared secret, RS256/ES256
with a PEM public key, a JWKS file or a JWKS URL (fetched with aiohttp, kept for
`jwt_jwks_cache_s`, fetched again early for an unknown `kid` at most every
`JWKS_REFRESH_MIN_S`).

A password that is not shaped like a JWT is not ours (IGNORE: the next authenticator
decides); a JWT that fails any check is refused with 0x86. `exp` is required. Claims map to the
user (`jwt_username_claim`, may be `tenant/name`), the tenant (`jwt_tenant_claim`) and ACL rules
(`jwt_acl_claim`, services/session/verdict.py `rules_from_external`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt

from services.common.mqtt.reason import ReasonCode as RC
from services.common.tenant_name import check_tenant
from services.session.auth import split_username
from services.session.verdict import IGNORE, Presented, Verdict, allow, deny, rules_from_external

log = logging.getLogger(__name__)
JWKS_REFRESH_MIN_S = 10.0
MAX_TOKEN_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class JwtConfig:
    algorithms: tuple[str, ...]
    secret: str = ""
    public_key_file: Path | None = None
    jwks_url: str = ""
    jwks_cache_s: float = 300.0
    audience: str = ""
    issuer: str = ""
    tenant_claim: str = "tenant"
    username_claim: str = "sub"
    acl_claim: str = "acl"


class _Keys:
    """Public keys by kid (from a JWKS) and/or one PEM key."""

    def __init__(self, cfg: JwtConfig) -> None:
        self._cfg = cfg
        self._pem: Any = None
        self._by_kid: dict[str, Any] = {}
        self._fetched_at = 0.0
        if cfg.public_key_file is not None:
            text = cfg.public_key_file.read_text()
            if text.lstrip().startswith("{"):
                self._by_kid = _jwks(json.loads(text))
            else:
                from cryptography.hazmat.primitives.serialization import load_pem_public_key

                self._pem = load_pem_public_key(text.encode())

    async def get(self, kid: str | None) -> Any:
        cfg = self._cfg
        if cfg.jwks_url:
            age = time.monotonic() - self._fetched_at
            stale = age > cfg.jwks_cache_s or (kid not in self._by_kid and age > JWKS_REFRESH_MIN_S)
            if stale or not self._fetched_at:
                await self._fetch()
        if kid is not None and kid in self._by_kid:
            return self._by_kid[kid]
        if kid is None and len(self._by_kid) == 1:
            return next(iter(self._by_kid.values()))
        return self._pem

    async def _fetch(self) -> None:
        self._fetched_at = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(self._cfg.jwks_url) as resp,
            ):
                resp.raise_for_status()
                self._by_kid = _jwks(await resp.json(content_type=None))
        except Exception as exc:  # keep the keys we had; the token fails if none fits
            log.warning("jwks_fetch_failed", extra={"error": str(exc)})


def _jwks(data: Any) -> dict[str, Any]:
    keys = {}
    for jwk in jwt.PyJWKSet.from_dict(data).keys:
        keys[jwk.key_id or ""] = jwk.key
    return keys


class JwtAuthenticator:
    def __init__(self, cfg: JwtConfig) -> None:
        self._cfg = cfg
        self._keys = _Keys(cfg)

    async def authenticate(self, p: Presented) -> Verdict:
        token_bytes = p.password or b""
        if token_bytes.count(b".") != 2 or len(token_bytes) > MAX_TOKEN_BYTES:
            return IGNORE
        try:
            token = token_bytes.decode("ascii")
            header = jwt.get_unverified_header(token)
        except (UnicodeDecodeError, jwt.DecodeError):
            return IGNORE  # not a JWT
        cfg = self._cfg
        alg = header.get("alg")
        if alg not in cfg.algorithms:
            return deny(f"JWT algorithm {alg!r} not accepted")
        key: Any = cfg.secret if alg.startswith("HS") else await self._keys.get(header.get("kid"))
        if not key:
            return deny("no key for this JWT")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=cfg.audience or None,
                issuer=cfg.issuer or None,
                options={"require": ["exp"], "verify_aud": bool(cfg.audience)},
            )
        except jwt.PyJWTError as exc:
            return deny(f"JWT refused: {exc}")
        return self._verdict(claims)

    def _verdict(self, claims: dict[str, Any]) -> Verdict:
        cfg = self._cfg
        subject = claims.get(cfg.username_claim)
        if not isinstance(subject, str) or not subject:
            return deny(f"JWT has no {cfg.username_claim!r} claim", RC.NOT_AUTHORIZED)
        try:
            tenant, name = split_username(subject)
            if "/" not in subject:
                tenant = ""
            claimed = claims.get(cfg.tenant_claim)
            if isinstance(claimed, str) and claimed:
                check_tenant(claimed)
                if tenant and tenant != claimed:
                    return deny("JWT names two tenants", RC.NOT_AUTHORIZED)
                tenant = claimed
            acl = rules_from_external(claims[cfg.acl_claim]) if cfg.acl_claim in claims else ()
        except ValueError as exc:
            return deny(f"JWT claims: {exc}", RC.NOT_AUTHORIZED)
        return allow(name, tenant, acl)
