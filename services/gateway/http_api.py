"""The HTTP publish API (aiohttp), EMQX 5's shape: `POST /api/v5/publish` (one JSON object,
answered `{"id": ...}`) and `POST /api/v5/publish/bulk` (a list, answered with a list of
`{"id": ...}` in order). The handlers only translate: the address rate (address_rate.py),
the caller (callers.py), the body (message_input.py) and the publish (publishing.py) decide.

Errors are `{"code": ..., "message": ...}` with 400 (bad JSON, topic, payload), 401 (no or
bad credentials; `WWW-Authenticate` names both schemes), 403 (ACL, another tenant), 413
(body over `gateway_http_max_body_bytes`, refused before it is read), 429 with `Retry-After`
(the address's request rate, or the tenant's rate quota), 503 (a service did not answer).
`GET /api/v5/status` answers 200 without credentials (a load balancer's probe).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.common.forwarded import TrustedProxies, client_address, split_x_forwarded_for
from services.common.tenant_name import TENANT_NAME
from services.gateway.address_rate import AddressRate
from services.gateway.callers import Caller, CallerError, Callers
from services.gateway.message_input import (
    BadInputError,
    InputLimits,
    PublishItem,
    parse_bulk,
    parse_item,
)
from services.gateway.publishing import Publisher, Publishing, PublishRefusedError

_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    413: "PAYLOAD_TOO_LARGE",
    429: "TOO_MANY_REQUESTS",
    503: "SERVICE_UNAVAILABLE",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpApi:
    callers: Callers
    publishing: Publishing
    limits: InputLimits
    address_rate: AddressRate
    trusted: TrustedProxies
    max_body_bytes: int


API: web.AppKey[HttpApi] = web.AppKey("gateway_http_api", HttpApi)


def build_app(api: HttpApi) -> web.Application:
    app = web.Application(client_max_size=api.max_body_bytes)
    app[API] = api
    app.router.add_post("/api/v5/publish", _publish_one)
    app.router.add_post("/api/v5/publish/bulk", _publish_bulk)
    app.router.add_get("/api/v5/status", _status)
    return app


async def _status(request: web.Request) -> web.Response:
    return web.json_response({"status": "running"})


async def _publish_one(request: web.Request) -> web.Response:
    try:
        api, caller, body = await _admitted(request)
        item = parse_item(body, api.limits)
        ids = await _publish_checked(api, _publisher(caller, [item]), [item])
    except BadInputError as exc:
        return _RefusedError(400, str(exc)).response()
    except _RefusedError as r:
        return r.response()
    return web.json_response({"id": ids[0]})


async def _publish_bulk(request: web.Request) -> web.Response:
    try:
        api, caller, body = await _admitted(request)
        items = parse_bulk(body, api.limits)
        ids = await _publish_checked(api, _publisher(caller, items), items)
    except BadInputError as exc:
        return _RefusedError(400, str(exc)).response()
    except _RefusedError as r:
        return r.response()
    return web.json_response([{"id": i} for i in ids])


class _RefusedError(Exception):
    def __init__(self, status: int, reason: str, retry_after_s: float = 0.0) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after_s = status, reason, retry_after_s

    def response(self) -> web.Response:
        headers = {}
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Bearer, Basic realm="starling"'
        if self.status == 429:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        body = {"code": _CODES.get(self.status, "ERROR"), "message": self.reason}
        return web.json_response(body, status=self.status, headers=headers)


async def _admitted(request: web.Request) -> tuple[HttpApi, Caller, Any]:
    """The address's rate, the body's size, the caller and the JSON body, in that order
    (cheap refusals first; the body is read only for a known caller)."""
    api = request.app[API]
    address = _address(request, api.trusted)
    wait = api.address_rate.admit(address, time.monotonic())
    if wait is not None:
        raise _RefusedError(429, "too many requests from this address", wait)
    length = request.content_length
    if length is not None and length > api.max_body_bytes:
        raise _RefusedError(
            413, f"body over {api.max_body_bytes} bytes (gateway_http_max_body_bytes)"
        )
    try:
        caller = await api.callers.caller(request.headers.get("Authorization", ""), address)
    except CallerError as exc:
        raise _RefusedError(exc.status, exc.reason) from None
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _RefusedError(
            413, f"body over {api.max_body_bytes} bytes (gateway_http_max_body_bytes)"
        ) from None
    try:
        return api, caller, json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _RefusedError(400, "the body is not JSON") from None


def _publisher(caller: Caller, items: list[PublishItem]) -> Publisher:
    """The tenant the items go to: the caller's, or (operator) the one they name."""
    named = {item.tenant for item in items if item.tenant}
    if caller.tenant:
        other = named - {caller.tenant}
        if other:
            raise _RefusedError(403, f"this token administers tenant {caller.tenant!r} only")
        return Publisher(caller.tenant, caller.identity, caller.acl)
    if len(named) != 1 or any(not item.tenant for item in items):
        raise _RefusedError(
            400, "with the operator token every message names its tenant (one per request)"
        )
    tenant = named.pop()
    if not TENANT_NAME.fullmatch(tenant):
        raise _RefusedError(400, f"invalid tenant {tenant!r}")
    return Publisher(tenant, caller.identity, caller.acl)


async def _publish_checked(api: HttpApi, who: Publisher, items: list[PublishItem]) -> list[str]:
    try:
        return await api.publishing.publish(who, items)
    except PublishRefusedError as exc:
        raise _RefusedError(exc.status, exc.reason, exc.retry_after_s) from None


def _address(request: web.Request, trusted: TrustedProxies) -> str:
    peer = request.remote or ""
    if not trusted:
        return peer
    forwarded = [f.get("for") for f in request.forwarded]
    xff = split_x_forwarded_for(request.headers.getall("X-Forwarded-For", []))
    return client_address(peer, trusted, forwarded, xff)
