"""What every console page shares: the app's dependencies (`Console`), the signed-in
request (`Ctx`), the one place a request's tenant is decided (`scope`), the CSRF check on
every change, the client address, and the security headers of every response.

Invariant: no handler reads a `tenant` parameter itself; each gets `ctx.tenant`, which for a
tenant token is the token's own tenant whatever the URL or form asks for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web

from services.common.forwarded import TrustedProxies, client_address, split_x_forwarded_for
from services.console.audit import Auditor
from services.console.backends import AdminClients, Backends
from services.console.drains import Drains
from services.console.history import History
from services.console.instances import Directory
from services.console.signin import COOKIE, Principal, Sessions, same

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# htmx's indicator styles are turned off in base.html, so no inline style is needed.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Console:
    """The console's dependencies, built once by main.py."""

    sessions: Sessions
    backends: Backends
    auditor: Auditor
    trusted: TrustedProxies
    page_size: int
    cookie_secure: bool
    history: History  # the overview's samples
    directory: Directory  # the instances to watch and the nodes to drain
    drains: Drains  # drains begun from the console


CONSOLE = web.AppKey("console", Console)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ctx:
    """A signed-in request."""

    console: Console
    principal: Principal
    tenant: str  # the tenant this request acts on ("" : none chosen, operator only)
    clients: AdminClients
    address: str

    async def audit(
        self, action: str, target: str = "", detail: str = "", outcome: str = "ok"
    ) -> None:
        await self.console.auditor.record(
            self.principal,
            tenant=self.tenant,
            action=action,
            target=target,
            detail=detail,
            address=self.address,
            outcome=outcome,
        )


def scope(principal: Principal, asked: str) -> str:
    """The tenant a request acts on: a tenant token's own, whatever was asked; the asked one
    for the operator."""
    return principal.tenant or asked.strip()


def address_of(request: web.Request, trusted: TrustedProxies) -> str:
    peer = request.remote or ""
    forwarded = [f.get("for") for f in request.forwarded]
    xff = split_x_forwarded_for(request.headers.getall("X-Forwarded-For", []))
    return client_address(peer, trusted, forwarded, xff)


async def signed_in(request: web.Request, asked_tenant: str | None = None) -> Ctx:
    """The request's context; redirects to the sign-in page without a live session."""
    console = request.app[CONSOLE]
    principal = await console.sessions.find(request.cookies.get(COOKIE, ""))
    if principal is None:
        raise web.HTTPSeeOther("/")
    asked = request.query.get("tenant", "") if asked_tenant is None else asked_tenant
    return Ctx(
        console=console,
        principal=principal,
        tenant=scope(principal, asked),
        clients=console.backends.clients(principal.token),
        address=address_of(request, console.trusted),
    )


async def changing(request: web.Request) -> tuple[Ctx, Mapping[str, str]]:
    """A change (POST): the context and the form, once its CSRF token matched the session's;
    403 otherwise."""
    form = await request.post()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    ctx = await signed_in(request, fields.get("tenant", ""))
    if not same(fields.get("csrf", ""), ctx.principal.csrf):
        raise web.HTTPForbidden(text="The form's CSRF token is missing or stale: reload it.")
    return ctx, fields


def back(path: str, ctx: Ctx, **params: str) -> web.HTTPSeeOther:
    """Redirect after a change to `path` with the tenant and a message."""
    query = {k: v for k, v in {"tenant": ctx.tenant, **params}.items() if v}
    return web.HTTPSeeOther(f"{path}?{urlencode(query)}" if query else path)


def render(request: web.Request, template: str, ctx: Ctx | None, **values: Any) -> web.Response:
    base: dict[str, Any] = {"message": request.query.get("msg", "")}
    if ctx is not None:
        base.update(principal=ctx.principal, tenant=ctx.tenant, csrf=ctx.principal.csrf)
    base.update(values)
    return aiohttp_jinja2.render_template(template, request, base)


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"
    await request.app[CONSOLE].backends.close_dropped()
    return response
