"""Rules: list, create (the SQL checked by the rules admin API, also as you type), enable or
disable, delete, and try against a sample message (TestRule)."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from services.common.clock import now_ms
from services.common.rpc.errors import ServiceError
from services.console.web import back, changing, render, signed_in
from starling.rules.v1 import rules_pb2 as pb


def parse_params(text: str) -> dict[str, str]:
    """`key=value` lines (blank lines skipped); ValueError naming a line without `=`."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"not key=value: {line.strip()!r}")
        out[key.strip()] = value.strip()
    return out


def sample(form: Mapping[str, str]) -> pb.SampleMessage:
    return pb.SampleMessage(
        topic=form.get("topic", "") or "test/topic",
        payload=form.get("payload", "").encode(),
        qos=int(form.get("qos", "0") or 0) if form.get("qos", "0").isdigit() else 0,
        client_id=form.get("client_id", "") or "console",
        username=form.get("username", ""),
        published_at_ms=now_ms(),
    )


async def rules(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    listed: list[pb.Rule] = []
    error = ""
    if ctx.tenant:
        try:
            listed = await ctx.clients.rules.list(ctx.tenant)
        except ServiceError as exc:
            error = str(exc)
    return render(request, "rules.html", ctx, rules=listed, error=error, result=None)


async def create(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    rule_id = form.get("rule_id", "").strip()
    try:
        actions = [(form.get("action", "republish").strip(), parse_params(form.get("params", "")))]
        await ctx.clients.rules.create(
            ctx.tenant,
            rule_id,
            form.get("sql", ""),
            actions,
            description=form.get("description", ""),
        )
    except (ServiceError, ValueError) as exc:
        await ctx.audit("rule_create", f"rule {rule_id}", outcome=f"refused: {exc}")
        raise back("/rules", ctx, msg=f"Rule not created: {exc}") from None
    await ctx.audit("rule_create", f"rule {rule_id}", detail=form.get("sql", ""))
    raise back("/rules", ctx, msg=f"Created rule {rule_id}")


async def set_enabled(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    rule_id, enabled = form.get("rule_id", ""), form.get("enabled") == "true"
    action = "rule_enable" if enabled else "rule_disable"
    try:
        await ctx.clients.rules.set_enabled(ctx.tenant, rule_id, enabled)
    except ServiceError as exc:
        await ctx.audit(action, f"rule {rule_id}", outcome=f"failed: {exc}")
        raise back("/rules", ctx, msg=f"Failed: {exc}") from None
    await ctx.audit(action, f"rule {rule_id}")
    raise back("/rules", ctx, msg=f"Rule {rule_id} {'enabled' if enabled else 'disabled'}")


async def delete(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    rule_id = form.get("rule_id", "")
    try:
        deleted = await ctx.clients.rules.delete(ctx.tenant, rule_id)
    except ServiceError as exc:
        await ctx.audit("rule_delete", f"rule {rule_id}", outcome=f"failed: {exc}")
        raise back("/rules", ctx, msg=f"Failed: {exc}") from None
    await ctx.audit("rule_delete", f"rule {rule_id}", outcome="ok" if deleted else "not found")
    raise back("/rules", ctx, msg=f"Deleted rule {rule_id}" if deleted else "No such rule")


async def test(request: web.Request) -> web.StreamResponse:
    """Try SQL (or a stored rule) on a sample message; nothing is changed or recorded."""
    ctx, form = await changing(request)
    listed: list[pb.Rule] = []
    try:
        result = await ctx.clients.rules.test(
            ctx.tenant, sample(form), rule_id=form.get("rule_id", ""), sql=form.get("sql", "")
        )
        listed = await ctx.clients.rules.list(ctx.tenant)
        error = ""
    except ServiceError as exc:
        result, error = None, str(exc)
    return render(request, "rules.html", ctx, rules=listed, result=result, error=error, form=form)


async def check(request: web.Request) -> web.StreamResponse:
    """The SQL check as you type (an htmx fragment): TestRule on an empty message."""
    ctx, form = await changing(request)
    sql = form.get("sql", "")
    if not sql.strip():
        return web.Response(text="", content_type="text/html")
    try:
        # Only a refusal is a problem of the SQL: an evaluation error on the empty sample
        # (a missing payload field) is the sample's.
        await ctx.clients.rules.test(ctx.tenant, pb.SampleMessage(topic="x"), sql=sql)
        problem = ""
    except ServiceError as exc:
        problem = str(exc)
    return render(request, "sql_check.html", ctx, problem=problem)
