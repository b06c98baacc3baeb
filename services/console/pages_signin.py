"""Sign-in (`/`) and sign-out; the overview is pages_overview.py."""

from __future__ import annotations

import logging

import aiohttp_jinja2
from aiohttp import web

from services.common.rpc.errors import ServiceError
from services.console.signin import COOKIE, SIGN_IN_COOKIE, new_secret, same
from services.console.web import CONSOLE, Console, address_of, changing

log = logging.getLogger("starling.console")


def _sign_in_page(request: web.Request, error: str = "", status: int = 200) -> web.Response:
    console = request.app[CONSOLE]
    form_token = new_secret()
    response = aiohttp_jinja2.render_template(
        "signin.html", request, {"error": error, "form_token": form_token}, status=status
    )
    _cookie(response, console, SIGN_IN_COOKIE, form_token, 600)
    return response


def _cookie(
    response: web.StreamResponse, console: Console, name: str, value: str, ttl: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=ttl,
        httponly=True,
        samesite="Strict",
        secure=console.cookie_secure,
        path="/",
    )


async def index(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    if await console.sessions.find(request.cookies.get(COOKIE, "")) is not None:
        raise web.HTTPSeeOther("/overview")
    return _sign_in_page(request)


async def sign_in(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    form = await request.post()
    address = address_of(request, console.trusted)
    if not same(str(form.get("form_token", "")), request.cookies.get(SIGN_IN_COOKIE, "")):
        return _sign_in_page(request, "The sign-in form expired: try again.", 403)
    if not await console.sessions.allow_attempt(address):
        log.warning("console_sign_in_limited", extra={"address": address})
        return _sign_in_page(request, "Too many sign-in attempts: wait a minute.", 429)
    try:
        principal = await console.sessions.principal_of(str(form.get("token", "")))
    except ServiceError:
        return _sign_in_page(request, "The session service cannot be reached: try again.", 503)
    if principal is None:
        log.warning("console_sign_in_refused", extra={"address": address})
        # 200: the page is the answer (a 4xx would also be logged as a browser error).
        return _sign_in_page(request, "That token is not valid.")
    sid = await console.sessions.open(principal)
    log.info("console_signed_in", extra={"who": principal.name, "address": address})
    response = web.HTTPSeeOther("/overview")
    _cookie(response, console, COOKIE, sid, console.sessions.ttl_s)
    response.del_cookie(SIGN_IN_COOKIE, path="/")
    return response


async def sign_out(request: web.Request) -> web.StreamResponse:
    await changing(request)
    console = request.app[CONSOLE]
    await console.sessions.close(request.cookies.get(COOKIE, ""))
    response = web.HTTPSeeOther("/")
    response.del_cookie(COOKIE, path="/")
    return response
