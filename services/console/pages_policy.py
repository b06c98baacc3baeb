"""Access policy pages: the tenant's ACL (edited as text, validated by the session service),
its quotas (set through the quota admin API) and auto-subscriptions (the rules admin API);
each change recorded in the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields

from aiohttp import web

from services.common.rpc.errors import ServiceError
from services.console.acl_text import AclTextError, format_rules, parse_rules
from services.console.web import back, changing, render, signed_in
from services.quota.client import Limits

LIMIT_NAMES = tuple(f.name for f in fields(Limits))


async def policy(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    acl, limits, autosubs, error = "", {}, [], ""
    if ctx.tenant:
        try:
            acl = format_rules(await ctx.clients.session.get_acl(ctx.tenant))
            limits = asdict(await ctx.clients.quota.get_limits(ctx.tenant))
            autosubs = list(await ctx.clients.rules.autosubs(ctx.tenant))
        except ServiceError as exc:
            error = str(exc)
    return render(
        request, "policy.html", ctx, acl=acl, limits=limits, autosubs=autosubs, error=error
    )


async def set_acl(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    text = form.get("acl", "")
    try:
        rules = parse_rules(text)
        await ctx.clients.session.set_acl(ctx.tenant, rules)
    except (AclTextError, ServiceError) as exc:
        await ctx.audit("acl_set", "acl", outcome=f"refused: {exc}")
        raise back("/policy", ctx, msg=f"ACL not saved: {exc}") from None
    await ctx.audit("acl_set", "acl", detail=format_rules(rules).replace("\n", "; "))
    raise back("/policy", ctx, msg=f"ACL saved ({len(rules)} rules)")


def parse_limits(form: Mapping[str, str]) -> Limits:
    """Whole numbers from 0 (unlimited) up, one per limit; ValueError naming a bad one."""
    values = {}
    for name in LIMIT_NAMES:
        text = (form.get(name, "0") or "0").strip()
        if not text.isdigit():
            raise ValueError(f"{name}: a whole number (0: unlimited), not {text!r}")
        values[name] = int(text)
    return Limits(**values)


async def set_limits(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    if not ctx.principal.operator:  # a tenant must not raise its own limits
        await ctx.audit("limits_set", "quotas", outcome="refused: operator only")
        raise back("/policy", ctx, msg="Quotas not saved: only the operator sets them")
    try:
        limits = parse_limits(form)
        await ctx.clients.quota.set_limits(ctx.tenant, limits)
    except (ValueError, ServiceError) as exc:
        await ctx.audit("limits_set", "quotas", outcome=f"refused: {exc}")
        raise back("/policy", ctx, msg=f"Quotas not saved: {exc}") from None
    changed = ", ".join(f"{k}={v}" for k, v in asdict(limits).items() if v)
    await ctx.audit("limits_set", "quotas", detail=changed or "unlimited")
    raise back("/policy", ctx, msg="Quotas saved")


async def add_autosub(request: web.Request) -> web.StreamResponse:
    """An auto-subscription: every client of the tenant subscribed to `filter` on connect."""
    ctx, form = await changing(request)
    topic_filter, qos = form.get("filter", "").strip(), form.get("qos", "0")
    try:
        await ctx.clients.rules.add_autosub(ctx.tenant, topic_filter, int(qos))
    except (ValueError, ServiceError) as exc:
        await ctx.audit("autosub_add", f"filter {topic_filter}", outcome=f"refused: {exc}")
        raise back("/policy", ctx, msg=f"Auto-subscription not added: {exc}") from None
    await ctx.audit("autosub_add", f"filter {topic_filter}", detail=f"qos {qos}")
    raise back("/policy", ctx, msg=f"Auto-subscription {topic_filter} added")


async def delete_autosub(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    topic_filter = form.get("filter", "")
    try:
        deleted = await ctx.clients.rules.delete_autosub(ctx.tenant, topic_filter)
    except ServiceError as exc:
        await ctx.audit("autosub_delete", f"filter {topic_filter}", outcome=f"failed: {exc}")
        raise back("/policy", ctx, msg=f"Not deleted: {exc}") from None
    outcome = "ok" if deleted else "not found"
    await ctx.audit("autosub_delete", f"filter {topic_filter}", outcome=outcome)
    raise back("/policy", ctx, msg=f"Auto-subscription {topic_filter} deleted")
