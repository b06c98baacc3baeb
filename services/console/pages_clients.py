"""Clients: the paged list of a tenant's connected clients with search and Kick, and one
client's page (its connection and its persistent subscriptions)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from services.common.rpc.errors import NotFoundError, ServiceError
from services.console.web import back, changing, render, signed_in
from services.session.client import ClientInfo, SessionAdminClient


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[ClientInfo]
    number: int  # 1-based
    pages: int
    total: int


def _page_number(text: str) -> int:
    return int(text) if text.isdigit() else 1


async def _page(
    session: SessionAdminClient, tenant: str, query: str, request: web.Request, size: int
) -> Page:
    """One page of the search, asked of the session service (it pages and counts, so a
    tenant with 10,000 clients sends one page, not all of them)."""
    number = _page_number(request.query.get("page", ""))
    found = await session.clients_page(tenant, query=query, offset=(number - 1) * size, limit=size)
    pages = max(1, -(-found.total // size))
    if number > pages:  # past the end (fewer clients since): the last page
        number = pages
        found = await session.clients_page(
            tenant, query=query, offset=(number - 1) * size, limit=size
        )
    return Page(list(found.clients), number, pages, found.total)


async def clients(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    query = request.query.get("q", "")
    page, error = Page([], 1, 1, 0), ""
    if ctx.tenant:
        try:
            page = await _page(
                ctx.clients.session, ctx.tenant, query, request, ctx.console.page_size
            )
        except ServiceError as exc:
            error = str(exc)
    return render(request, "clients.html", ctx, page=page, query=query, error=error)


async def client(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    client_id = request.match_info["client_id"]
    info, subscriptions, error = None, [], ""
    if ctx.tenant:
        try:
            found = await ctx.clients.session.clients_page(ctx.tenant, client_id=client_id)
            info = found.clients[0] if found.clients else None
            routes = await ctx.clients.router.list_routes(ctx.tenant, persistent_only=True)
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
