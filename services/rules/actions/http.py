"""The HTTP webhook action (aiohttp): outputs POSTed (or PUT) to a URL, one per request or
batched into a JSON array.

Params: `url` (http/https, required), `method` (POST|PUT, default POST), `header.<Name>`
(any number), `timeout_ms` (default 5000), `batch_size` (outputs per request, default 1: the
body is the output's payload; above 1 the body is a JSON array of the payloads), `batch_ms`
(how long a batch may wait to fill, default 0), `max_in_flight` (requests at once, default 1),
`ca_file`, `tls_verify` (default true).

Responses: 2xx delivered; 408, 429 and 5xx (and timeouts, connection errors) retried by the
delivery; any other status is permanent and the outputs go to the dead letters at once.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from services.rules.actions.base import ActionContext, Output, PermanentActionError
from services.rules.actions.delivery import Batching
from services.rules.actions.params import Params

RETRYABLE = frozenset({408, 425, 429})


class HttpStatusError(Exception):
    """A retryable status (5xx, 408, 425, 429)."""


def _item(payload: bytes) -> Any:
    """A payload as an element of a JSON array body: its JSON if it is JSON, else its text."""
    try:
        return json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace")


class HttpAction:
    def __init__(
        self,
        url: str,
        method: str,
        headers: dict[str, str],
        timeout_s: float,
        batching: Batching,
        ssl_ctx: ssl.SSLContext | bool,
    ) -> None:
        self.url = url
        self.method = method
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.batching = batching  # read by Delivery
        self._ssl = ssl_ctx
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout,
                connector=aiohttp.TCPConnector(limit=self.batching.in_flight, ssl=self._ssl),
            )

    async def send(self, outputs: Sequence[Output]) -> None:
        if self._session is None:
            await self.start()
        assert self._session is not None
        if self.batching.max_outputs == 1:
            for o in outputs:
                await self._request(o.payload)
        else:
            body = json.dumps([_item(o.payload) for o in outputs], separators=(",", ":"))
            await self._request(body.encode())

    async def _request(self, body: bytes) -> None:
        assert self._session is not None
        async with self._session.request(
            self.method, self.url, data=body, headers=self.headers, allow_redirects=False
        ) as resp:
            await resp.read()  # the connection goes back to the pool only once read
            status = resp.status
        if 200 <= status < 300:
            return
        if status >= 500 or status in RETRYABLE:
            raise HttpStatusError(f"{self.method} {self.url}: HTTP {status}")
        raise PermanentActionError(f"{self.method} {self.url}: HTTP {status}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def build(p: Params, ctx: ActionContext) -> HttpAction:
    url = p.text("url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: {url!r} is not an http(s) URL")
    method = p.choice("method", "POST", ("POST", "PUT"))
    headers = p.prefixed("header.")
    for name, value in headers.items():
        if not name.replace("-", "").isalnum() or "\n" in value or "\r" in value:
            raise ValueError(f"header.{name}: not a valid header")
    timeout_s = p.integer("timeout_ms", 5000, 1, 600_000) / 1000
    batching = Batching(
        max_outputs=p.integer("batch_size", 1, 1, 10_000),
        linger_s=p.integer("batch_ms", 0, 0, 60_000) / 1000,
        in_flight=p.integer("max_in_flight", 1, 1, 64),
    )
    ca_file = p.file("ca_file")
    verify = p.flag("tls_verify", True)
    ssl_ctx: ssl.SSLContext | bool = True
    if parts.scheme == "https":
        ssl_ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if not verify:
            ssl_ctx.check_hostname = False
            ssl_ctx.verify_mode = ssl.CERT_NONE
    return HttpAction(url, method, headers, timeout_s, batching, ssl_ctx)
