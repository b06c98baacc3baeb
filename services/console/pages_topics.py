"""Topics: the tenant's routes (transient filters with their nodes, persistent ones with
their sessions), retained messages (browse by filter, view the payload as text, JSON or
hex, delete) and delayed messages (cancel)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiohttp import web

from services.common.rpc.errors import NotFoundError, ServiceError
from services.console.web import back, changing, render, signed_in

SHOWN = 100


@dataclass(frozen=True, slots=True)
class Payload:
    """A payload as the page shows it: `kind` is "json", "text" or "hex"."""

    kind: str
    text: str
    size: int


def payload_view(payload: bytes, limit: int = 4096) -> Payload:
    """JSON pretty-printed when it parses, UTF-8 text when it decodes, hex otherwise."""
    head = payload[:limit]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return Payload("hex", head.hex(" "), len(payload))
    try:
        return Payload("json", json.dumps(json.loads(payload), indent=2), len(payload))
    except ValueError:
        return Payload("text", text, len(payload))


async def topics(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    topic_filter = request.query.get("filter", "") or "#"
    values: dict[str, object] = {"routes": [], "retained": [], "delayed": [], "stored": 0}
    error = ""
    if ctx.tenant:
        try:
            listing = await ctx.clients.router.list_retained(ctx.tenant, topic_filter, SHOWN)
            values["retained"] = [(m, payload_view(m.payload)) for m in listing.messages]
            values["stored"] = listing.stored
            values["routes"] = await ctx.clients.router.list_routes(ctx.tenant)
            values["delayed"] = [
                (d, payload_view(d.message.payload))
                for d in await ctx.clients.router.list_delayed(ctx.tenant)
            ]
        except ServiceError as exc:
            error = str(exc)
    return render(request, "topics.html", ctx, filter=topic_filter, error=error, **values)


async def delete_retained(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    topic = form.get("topic", "")
    try:
        deleted = await ctx.clients.router.delete_retained(ctx.tenant, topic)
    except ServiceError as exc:
        await ctx.audit("retained_delete", f"topic {topic}", outcome=f"failed: {exc}")
        raise back("/topics", ctx, msg=f"Not deleted: {exc}") from None
    await ctx.audit("retained_delete", f"topic {topic}", outcome="ok" if deleted else "not found")
    raise back("/topics", ctx, msg=f"Deleted the retained message of {topic}")


async def cancel_delayed(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    delayed_id = form.get("id", "")
    try:
        await ctx.clients.router.cancel_delayed(ctx.tenant, delayed_id)
    except NotFoundError:
        await ctx.audit("delayed_cancel", f"delayed {delayed_id}", outcome="not found")
        raise back("/topics", ctx, msg="Already published or cancelled") from None
    except ServiceError as exc:
        await ctx.audit("delayed_cancel", f"delayed {delayed_id}", outcome=f"failed: {exc}")
        raise back("/topics", ctx, msg=f"Not cancelled: {exc}") from None
    await ctx.audit("delayed_cancel", f"delayed {delayed_id}")
    raise back("/topics", ctx, msg=f"Cancelled delayed message {delayed_id}")
