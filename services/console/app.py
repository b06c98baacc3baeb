"""The console's aiohttp application: routes, templates (Jinja2, autoescaped), static files
(htmx, the stylesheet and a small script, vendored: no JavaScript build)."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from services.console import (
    pages_access,
    pages_audit,
    pages_clients,
    pages_operations,
    pages_overview,
    pages_policy,
    pages_rule,
    pages_rules,
    pages_sessions,
    pages_signin,
    pages_topics,
)
from services.console.web import CONSOLE, Console, security_headers

HERE = Path(__file__).resolve().parent


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + " UTC" if ms else "never"


def _num(v: float) -> str:
    """A figure for a person: whole numbers from 10 up, one decimal below."""
    return f"{v:,.0f}" if abs(v) >= 10 or v == int(v) else f"{v:.1f}"


def build_app(console: Console) -> web.Application:
    app = web.Application(middlewares=[security_headers], client_max_size=256 * 1024)
    app[CONSOLE] = console
    env = aiohttp_jinja2.setup(
        app, loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True
    )
    env.filters["when"] = _when
    env.filters["num"] = _num
    app.router.add_get("/", pages_signin.index)
    app.router.add_post("/", pages_signin.sign_in)
    app.router.add_post("/sign-out", pages_signin.sign_out)
    app.router.add_get("/overview", pages_overview.overview)
    app.router.add_get("/overview/live", pages_overview.live)
    app.router.add_get("/operations", pages_operations.operations)
    app.router.add_get("/operations/live", pages_operations.live)
    app.router.add_post("/operations/drain", pages_operations.drain)
    app.router.add_get("/clients", pages_clients.clients)
    app.router.add_get("/clients/{client_id:.+}", pages_clients.client)
    app.router.add_post("/clients/kick", pages_clients.kick)
    app.router.add_get("/rules", pages_rules.rules)
    app.router.add_post("/rules", pages_rules.create)
    app.router.add_post("/rules/update", pages_rule.update)
    app.router.add_post("/rules/enabled", pages_rules.set_enabled)
    app.router.add_post("/rules/delete", pages_rules.delete)
    app.router.add_post("/rules/test", pages_rules.test)
    app.router.add_post("/rules/check", pages_rules.check)
    app.router.add_post("/rules/dead-letters/replay", pages_rule.replay)
    app.router.add_post("/rules/dead-letters/purge", pages_rule.purge)
    app.router.add_get("/rules/{rule_id}", pages_rule.rule)
    app.router.add_get("/access", pages_access.access)
    app.router.add_post("/access/bans", pages_access.add_ban)
    app.router.add_post("/access/bans/remove", pages_access.remove_ban)
    app.router.add_post("/access/users", pages_access.add_user)
    app.router.add_post("/access/users/delete", pages_access.delete_user)
    app.router.add_post("/access/tokens", pages_access.create_token)
    app.router.add_post("/access/tokens/revoke", pages_access.revoke_token)
    app.router.add_get("/topics", pages_topics.topics)
    app.router.add_post("/topics/retained/delete", pages_topics.delete_retained)
    app.router.add_post("/topics/delayed/cancel", pages_topics.cancel_delayed)
    app.router.add_get("/policy", pages_policy.policy)
    app.router.add_post("/policy/acl", pages_policy.set_acl)
    app.router.add_post("/policy/limits", pages_policy.set_limits)
    app.router.add_post("/policy/autosubs", pages_policy.add_autosub)
    app.router.add_post("/policy/autosubs/delete", pages_policy.delete_autosub)
    app.router.add_get("/sessions", pages_sessions.sessions)
    app.router.add_post("/sessions/discard", pages_sessions.discard)
    app.router.add_get("/audit", pages_audit.audit)
    app.router.add_static("/static", HERE / "static")
    return app
