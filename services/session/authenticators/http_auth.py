"""An HTTP auth service decides: POST JSON
`{"tenant", "username", "password", "client_id", "cert_common_name", "peer_address"}`
to `http_auth_url`, answered by `{"result": "allow"|"deny"|"ignore", "acl": [...],
"username": "..."}` (acl and username optional; rules as `rules_from_external` reads them).

Answers are cached for `http_auth_cache_ttl_s` by a digest of what was sent (the peer's IP
address, not its port). Any status but 200, a malformed answer, a timeout or a refused
connection is the service being unavailable: `http_auth_on_timeout` says what that means
("unavailable": CONNACK 0x88, "deny": 0x87, "ignore": the next authenticator decides);
such answers are never cached. At most `http_auth_max_concurrent` requests run at once; the
rest wait (the connection node's call deadline bounds the wait).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import aiohttp

from services.common.mqtt.reason import ReasonCode as RC
from services.session.throttle import peer_ip
from services.session.verdict import (
    IGNORE,
    Decision,
    Presented,
    Verdict,
    allow,
    deny,
    rules_from_external,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HttpAuthConfig:
    url: str
    timeout_s: float = 2.0
    on_timeout: str = "unavailable"  # "unavailable" | "deny" | "ignore"
    cache_ttl_s: float = 60.0
    cache_size: int = 10_000
    max_concurrent: int = 32


class HttpAuthenticator:
    def __init__(self, cfg: HttpAuthConfig) -> None:
        self._cfg = cfg
        self._http: aiohttp.ClientSession | None = None
        self._cache: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()
        self._sem = asyncio.Semaphore(cfg.max_concurrent)

    async def authenticate(self, p: Presented) -> Verdict:
        body = {
            "tenant": p.tenant,
            "username": p.username,
            "password": (p.password or b"").decode("utf-8", "replace"),
            "client_id": p.client_id,
            "cert_common_name": p.cert_common_name,
            "peer_address": p.peer_address,
        }
        key = hashlib.sha256(
            "\0".join([*(str(v) for k, v in body.items() if k != "peer_address")]).encode()
            + b"\0"
            + peer_ip(p.peer_address).encode()
        ).digest()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        verdict = await self._ask(body)
        if verdict.cacheable and self._cfg.cache_ttl_s > 0 and self._cfg.cache_size > 0:
            self._cache.pop(key, None)
            self._cache[key] = (time.monotonic() + self._cfg.cache_ttl_s, verdict)
            while len(self._cache) > self._cfg.cache_size:
                self._cache.popitem(last=False)
        return verdict

    async def _ask(self, body: dict[str, str]) -> Verdict:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._cfg.timeout_s)
            )
        try:
            async with self._sem, self._http.post(self._cfg.url, json=body) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP status {resp.status}")
                answer = await resp.json(content_type=None)
            return _verdict(answer)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("http_auth_unavailable", extra={"error": str(exc) or type(exc).__name__})
            return self._unavailable()

    def _unavailable(self) -> Verdict:
        on = self._cfg.on_timeout
        if on == "ignore":
            return Verdict(Decision.IGNORE, cacheable=False)
        if on == "deny":
            return deny("auth service unavailable", RC.NOT_AUTHORIZED, cacheable=False)
        return deny("auth service unavailable", RC.SERVER_UNAVAILABLE, cacheable=False)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


def _verdict(answer: Any) -> Verdict:
    """The service's JSON answer as a verdict; ValueError when it is malformed."""
    if not isinstance(answer, dict):
        raise ValueError("answer is not a JSON object")
    result = answer.get("result")
    if result == "ignore":
        return IGNORE
    if result == "deny":
        return deny("refused by the auth service")  # 0x86, like a wrong password
    if result != "allow":
        raise ValueError(f"bad result {result!r}")
    name = answer.get("username", "")
    if not isinstance(name, str):
        raise ValueError("username must be a string")
    acl = rules_from_external(answer["acl"]) if "acl" in answer else ()
    return allow(name, "", acl)
