"""Access: bans (add with reason and expiry, remove; a tenant token sees and changes its own
tenant's), users (add, delete) and tenant admin tokens (operator: create with expiry,
revoke). The ACL and quotas: pages_policy.py."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from services.common.bans import KIND_NAMES, Ban
from services.common.rpc.errors import ServiceError
from services.console.web import Ctx, back, changing, render, signed_in

KIND_LABELS = {v: k for k, v in KIND_NAMES.items()}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration_s(text: str) -> int:
    """Seconds in "", "3600", "90m", "12h", "30d", "2w" ("" : no expiry); ValueError otherwise."""
    text = text.strip().lower()
    if not text:
        return 0
    unit = text[-1] if text[-1] in _UNITS else "s"
    number = text[:-1] if text[-1] in _UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"bad duration {text!r}: a number with s, m, h, d or w")
    return int(number) * _UNITS[unit]


async def _part(out: dict[str, Any], name: str, call: Awaitable[object]) -> None:
    """One part of the page, or why it is missing (the rest of the page still shows)."""
    try:
        out[name] = await call
    except ServiceError as exc:
        out["errors"].append(f"{name}: {exc}")


async def _gather(ctx: Ctx) -> dict[str, Any]:
    """What the page shows: the bans (every one for the operator, the tenant's own for a
    tenant token) and the tenant's admin tokens (operator only: the API lists them to it
    alone)."""
    out: dict[str, Any] = {"errors": []}
    if ctx.principal.operator:
        await _part(out, "bans", ctx.clients.quota.list_bans())
        if ctx.tenant:
            await _part(out, "tokens", ctx.clients.tokens.list(ctx.tenant))
    elif ctx.tenant:
        await _part(out, "bans", ctx.clients.quota.list_bans(ctx.tenant))
    if "bans" in out and ctx.tenant:
        out["bans"] = [b for b in out["bans"] if b.tenant in (ctx.tenant, "")]
    return out


async def access(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    return render(request, "access.html", ctx, kinds=KIND_LABELS, **await _gather(ctx))


async def add_ban(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    kind_name, value = form.get("kind", ""), form.get("value", "").strip()
    target = f"{kind_name} {value}"
    try:
        ban = Ban(
            kind=KIND_NAMES[kind_name],
            tenant=ctx.tenant,
            value=value,
            reason=form.get("reason", ""),
        )
        await ctx.clients.quota.add_ban(ban, duration_s(form.get("duration", "")))
    except (KeyError, ValueError, ServiceError) as exc:
        await ctx.audit("ban_add", target, outcome=f"refused: {exc}")
        raise back("/access", ctx, msg=f"Ban not added: {exc}") from None
    await ctx.audit(
        "ban_add",
        target,
        detail=f"reason: {form.get('reason', '')}; "
        f"duration: {form.get('duration', '') or 'until removed'}",
    )
    raise back("/access", ctx, msg=f"Banned {target}")


async def remove_ban(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    kind_name, value = form.get("kind", ""), form.get("value", "")
    target = f"{kind_name} {value}"
    try:
        removed = await ctx.clients.quota.remove_ban(KIND_NAMES[kind_name], ctx.tenant, value)
    except (KeyError, ServiceError) as exc:
        await ctx.audit("ban_remove", target, outcome=f"failed: {exc}")
        raise back("/access", ctx, msg=f"Ban not removed: {exc}") from None
    await ctx.audit("ban_remove", target, outcome="ok" if removed else "not found")
    raise back("/access", ctx, msg=f"Removed ban {target}" if removed else "No such ban")


async def add_user(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    username = form.get("username", "").strip()
    try:
        await ctx.clients.session.create_user(ctx.tenant, username, form.get("password", ""))
    except ServiceError as exc:
        await ctx.audit("user_add", f"user {username}", outcome=f"refused: {exc}")
        raise back("/access", ctx, msg=f"User not added: {exc}") from None
    await ctx.audit("user_add", f"user {username}")
    raise back("/access", ctx, msg=f"Added user {username}")


async def delete_user(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    username = form.get("username", "").strip()
    try:
        deleted = await ctx.clients.session.delete_user(ctx.tenant, username)
    except ServiceError as exc:
        await ctx.audit("user_delete", f"user {username}", outcome=f"failed: {exc}")
        raise back("/access", ctx, msg=f"User not deleted: {exc}") from None
    await ctx.audit("user_delete", f"user {username}", outcome="ok" if deleted else "not found")
    raise back("/access", ctx, msg=f"Deleted user {username}" if deleted else "No such user")


async def create_token(request: web.Request) -> web.StreamResponse:
    """Operator: a tenant admin token, shown this once on the page that answers."""
    ctx, form = await changing(request)
    try:
        ttl = duration_s(form.get("ttl", "")) or 30 * 86400
        info, token = await ctx.clients.tokens.create(ctx.tenant, ttl, form.get("description", ""))
    except (ValueError, ServiceError) as exc:
        await ctx.audit("token_create", "", outcome=f"refused: {exc}")
        raise back("/access", ctx, msg=f"Token not created: {exc}") from None
    await ctx.audit("token_create", f"token {info.token_id}", detail=f"ttl {ttl} s")
    return render(
        request, "access.html", ctx, kinds=KIND_LABELS, new_token=token, **await _gather(ctx)
    )


async def revoke_token(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    token_id = form.get("token_id", "")
    try:
        revoked = await ctx.clients.tokens.revoke(token_id)
    except ServiceError as exc:
        await ctx.audit("token_revoke", f"token {token_id}", outcome=f"failed: {exc}")
        raise back("/access", ctx, msg=f"Token not revoked: {exc}") from None
    await ctx.audit("token_revoke", f"token {token_id}", outcome="ok" if revoked else "not found")
    raise back("/access", ctx, msg=f"Revoked token {token_id}" if revoked else "No such token")
