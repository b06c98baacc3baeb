"""Clients: the paged list of a tenant's connected clients with search and Kick, and one
client's page (its connection and its persistent subscriptions)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from services.common.rpc.errors import NotFoundError, ServiceError
from services.console.web import back, changing, render, signed_in
from services.session.client import ClientInfo


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ClientInfo]
    number: int  # 1-based
    pages: int
    total: int


def matches(c: ClientInfo, query: str) -> bool:
    """A search by client id, user or address (case-insensitive substring)."""
    q = query.strip().lower()
    return not q or any(q in v.lower() for v in (c.client_id, c.username, c.peer_address))


def page_of(clients: list[ClientInfo], query: str, number: int, size: int) -> Page:
    found = sorted((c for c in clients if matches(c, query)), key=lambda c: c.client_id)
    pages = max(1, -(-len(found) // size))
    number = min(max(1, number), pages)
    return Page(found[(number - 1) * size : number * size], number, pages, len(found))


def _page_number(text: str) -> int:
    return int(text) if text.isdigit() else 1


async def clients(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    query = request.query.get("q", "")
    page, error = Page([], 1, 1, 0), ""
    if ctx.tenant:
        try:
            listed = await ctx.clients.session.list_clients(ctx.tenant)
            size = ctx.console.page_size
            page = page_of(listed, query, _page_number(request.query.get("page", "")), size)
        except ServiceError as exc:
            error = str(exc)
    return render(request, "clients.html", ctx, page=page, query=query, error=error)


async def client(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    client_id = request.match_info["client_id"]
    info, subscriptions, error = None, [], ""
    if ctx.tenant:
        try:
            listed = await ctx.clients.session.list_clients(ctx.tenant)
            info = next((c for c in listed if c.client_id == client_id), None)
            routes = await ctx.clients.router.list_routes(ctx.tenant)
            prefix = f"{client_id}#"
            subscriptions = [
                r.topic_filter
                for r in routes
                if r.persistent and any(n.startswith(prefix) for n in r.node_ids)
            ]
        except ServiceError as exc:
            error = str(exc)
    return render(
        request,
        "client.html",
        ctx,
        client_id=client_id,
        info=info,
        subscriptions=subscriptions,
        error=error,
    )


async def kick(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    client_id = form.get("client_id", "")
    try:
        await ctx.clients.session.kick(ctx.tenant, client_id)
    except NotFoundError:
        await ctx.audit("kick", f"client {client_id}", outcome="not connected")
        raise back("/clients", ctx, msg=f"{client_id} is not connected") from None
    except ServiceError as exc:
        await ctx.audit("kick", f"client {client_id}", outcome=f"failed: {exc}")
        raise back("/clients", ctx, msg=f"Kick failed: {exc}") from None
    await ctx.audit("kick", f"client {client_id}")
    raise back("/clients", ctx, msg=f"Kicked {client_id}")
