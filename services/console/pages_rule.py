"""One rule's page: its SQL and actions, editing them in place (UpdateRule; the SQL checked as
you type, as on creation), its metrics and each action's (summed over the rules instances),
and its dead letters (deliveries its actions gave up on) with replay and purge. Edits,
replays and purges are recorded in the audit log."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from services.common.rpc.errors import ServiceError
from services.console.pages_rules import parse_params
from services.console.pages_topics import payload_view
from services.console.web import Ctx, back, changing, render, signed_in

SHOWN = 100
MAX_ACTIONS = 16  # form slots read; the rules service has its own, lower, limit


def edited_actions(form: Mapping[str, str]) -> list[tuple[str, dict[str, str]]]:
    """The actions of the edit form: slots `action_N` (kind; empty: none) with `params_N`
    (`key=value` lines); ValueError naming a bad line."""
    out = []
    for n in range(MAX_ACTIONS):
        kind = form.get(f"action_{n}", "").strip()
        if kind:
            out.append((kind, parse_params(form.get(f"params_{n}", ""))))
    return out


async def rule(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    rule_id = request.match_info["rule_id"]
    found, letters, count, error = None, [], 0, ""
    if ctx.tenant:
        try:
            found = await ctx.clients.rules.get(ctx.tenant, rule_id)
            listed = await ctx.clients.rules.dead_letters(ctx.tenant, rule_id, limit=SHOWN)
            letters = [(d, payload_view(d.payload)) for d in listed.letters]
            count = listed.count
        except ServiceError as exc:
            error = str(exc)
    return render(
        request,
        "rule.html",
        ctx,
        rule_id=rule_id,
        found=found,
        letters=letters,
        count=count,
        error=error,
        editing=request.query.get("edit") == "1",
    )


def _to_rule(ctx: Ctx, rule_id: str, **params: str) -> web.HTTPSeeOther:
    return back(f"/rules/{rule_id}", ctx, **params)


async def replay(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    rule_id = form.get("rule_id", "")
    try:
        done = await ctx.clients.rules.replay(ctx.tenant, rule_id)
    except ServiceError as exc:
        await ctx.audit("dead_letters_replay", f"rule {rule_id}", outcome=f"failed: {exc}")
        raise _to_rule(ctx, rule_id, msg=f"Replay failed: {exc}") from None
    summary = f"{done.delivered} delivered, {done.failed} failed"
    await ctx.audit("dead_letters_replay", f"rule {rule_id}", detail=summary)
    raise _to_rule(ctx, rule_id, msg=f"Replayed: {summary}")


async def purge(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    rule_id = form.get("rule_id", "")
    try:
        purged = await ctx.clients.rules.purge(ctx.tenant, rule_id)
    except ServiceError as exc:
        await ctx.audit("dead_letters_purge", f"rule {rule_id}", outcome=f"failed: {exc}")
        raise _to_rule(ctx, rule_id, msg=f"Purge failed: {exc}") from None
    await ctx.audit("dead_letters_purge", f"rule {rule_id}", detail=f"{purged} purged")
    raise _to_rule(ctx, rule_id, msg=f"Purged {purged} dead letters")


async def update(request: web.Request) -> web.StreamResponse:
    """The edit form: the rule replaced in place (same id, metrics and dead letters)."""
    ctx, form = await changing(request)
    rule_id = form.get("rule_id", "")
    sql = form.get("sql", "")
    try:
        await ctx.clients.rules.update(
            ctx.tenant,
            rule_id,
            sql,
            edited_actions(form),
            enabled=form.get("enabled") == "true",
            description=form.get("description", ""),
            if_updated_at_ms=int(form.get("version", "0") or 0),
        )
    except (ServiceError, ValueError) as exc:
        await ctx.audit("rule_update", f"rule {rule_id}", outcome=f"refused: {exc}")
        raise _to_rule(ctx, rule_id, msg=f"Rule not saved: {exc}") from None
    await ctx.audit("rule_update", f"rule {rule_id}", detail=sql)
    raise _to_rule(ctx, rule_id, msg=f"Saved rule {rule_id}")
