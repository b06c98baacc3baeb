"""Sessions and queues: a tenant's offline persistent sessions (client id, owner, queue
depth, age since disconnect, expiry) a page at a time from the session service's
ListSessions, searchable by client-id prefix, and Discard (confirmed first), which ends a
session as its expiry would (DiscardSession: its subscriptions and queue go)."""

from __future__ import annotations

from aiohttp import web

from services.common import clock
from services.common.rpc.errors import ServiceError
from services.console.web import back, changing, render, signed_in
from services.session.client import SessionPage


def age(since_ms: int, now_ms: int) -> str:
    """How long ago `since_ms` was, in the largest unit that fits ("3 d 4 h", "12 min")."""
    seconds = max(0, (now_ms - since_ms) // 1000)
    for unit, size, minor, minor_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60)):
        if seconds >= size:
            rest = (seconds % size) // minor_size
            return f"{seconds // size} {unit}" + (f" {rest} {minor}" if rest else "")
    return f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


async def sessions(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    query = request.query.get("q", "").strip()
    after = request.query.get("after", "")
    page, error = SessionPage(sessions=(), next=""), ""
    if ctx.tenant:
        try:
            page = await ctx.clients.session.list_sessions(
                ctx.tenant, prefix=query, after=after, limit=ctx.console.page_size
            )
        except ServiceError as exc:
            error = str(exc)
    now_ms = clock.now_ms()
    return render(
        request,
        "sessions.html",
        ctx,
        page=page,
        query=query,
        after=after,
        ages={s.client_id: age(s.disconnected_at_ms, now_ms) for s in page.sessions},
        error=error,
    )


async def discard(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    client_id = form.get("client_id", "")
    target = f"session {client_id}"
    try:
        done = await ctx.clients.session.discard_session(ctx.tenant, client_id)
    except ServiceError as exc:
        await ctx.audit("session_discard", target, outcome=f"failed: {exc}")
        raise back("/sessions", ctx, msg=f"Discard failed: {exc}") from None
    if not done:
        await ctx.audit("session_discard", target, outcome="no offline session")
        raise back("/sessions", ctx, msg=f"{client_id} has no offline session")
    await ctx.audit("session_discard", target)
    raise back("/sessions", ctx, msg=f"Discarded the session of {client_id}")
