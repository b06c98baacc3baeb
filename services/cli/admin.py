"""Admin subcommands (users, ACLs, clients, kick, routes, retained and delayed messages,
stats, tenant admin tokens, node drain, quotas and bans) over the services' typed admin
clients; replies print as JSON (services/cli/render.py), failures as
`starling <command>: <STATUS>: <message>`.

The admin token comes from STARLING_ADMIN_TOKEN or a file (`--token-file`, by default the one
`starling up` writes under the data dir), never from the command line, where `ps` and shell
history would show it."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from services.cli.acl_file import rule_to_json, rules_from_json
from services.cli.drain_cmd import NodeNotFoundError, add_drain_command, drain_command
from services.cli.launcher import Mesh
from services.cli.quota_cmd import add_quota_commands, quota_command
from services.cli.render import to_json
from services.cli.secrets import admin_token_file
from services.common.rpc.errors import ServiceError
from services.metrics.client import MetricsAdminClient
from services.quota.client import QuotaAdminClient
from services.router.client import RouterAdminClient
from services.session.client import SessionAdminClient
from services.session.token_client import TokenAdminClient

ROUTER_COMMANDS = ("routes", "retained", "delete-retained", "delayed", "cancel-delayed")
# Without a local mesh or an address: the services' default gRPC ports.
_DEFAULT_ADDRESSES = {
    "session": "127.0.0.1:7001",
    "router": "127.0.0.1:7002",
    "metrics": "127.0.0.1:7006",
    "quota": "127.0.0.1:7005",
    "rules": "127.0.0.1:7004",
}


def _address(args: argparse.Namespace, service: str) -> str:
    explicit = getattr(args, f"{service}_addr", None)
    if explicit:
        return str(explicit)
    try:
        mesh = Mesh.load(str(Path(args.data_dir).resolve()))
        return f"127.0.0.1:{mesh.by_name(service).grpc_port}"
    except (FileNotFoundError, StopIteration):
        return os.environ.get(f"STARLING_{service.upper()}_ADDR", _DEFAULT_ADDRESSES[service])


class TokenError(Exception):
    """The admin token cannot be read."""


def _token(args: argparse.Namespace) -> str:
    """STARLING_ADMIN_TOKEN, else the token file (explicit: must be readable; the default
    one of a local mesh: optional, the server then says the token is missing)."""
    env = os.environ.get("STARLING_ADMIN_TOKEN", "")
    if env:
        return env
    explicit = getattr(args, "token_file", None)
    path = Path(explicit) if explicit else admin_token_file(Path(args.data_dir))
    try:
        return path.read_text().strip()
    except OSError as exc:
        if explicit:
            raise TokenError(f"cannot read --token-file {explicit}: {exc.strerror}") from None
        return ""


MAX_PAGE = 1000
_TTL_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_ttl(text: str) -> int:
    """Seconds in "3600", "90m", "12h", "30d" or "2w"."""
    unit = text[-1:].lower()
    number = text[:-1] if unit in _TTL_UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(
            f"bad TTL {text!r}: a positive number with s, m, h, d or w"
        )
    return int(number) * _TTL_UNITS.get(unit, 1)


def page_limit(text: str) -> int:
    """A `--limit`: a whole number from 1 to 1,000 (the APIs take an unsigned count; a
    negative one failed in the client library with a traceback)."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"bad limit {text!r}: a whole number from 1 to {MAX_PAGE}")
    return int(text)


async def _tokens(c: TokenAdminClient, args: argparse.Namespace) -> object:
    if args.token_command == "create":
        info, token = await c.create(args.tenant, args.ttl, args.description)
        return {**dataclasses.asdict(info), "token": token}
    if args.token_command == "list":
        return {"tokens": await c.list(args.tenant or "")}
    return {"revoked": await c.revoke(args.token_id)}


async def _router(c: RouterAdminClient, args: argparse.Namespace) -> object:
    cmd, tenant = args.command, args.tenant
    if cmd == "routes":
        return {"routes": await c.list_routes(tenant)}
    if cmd == "retained":
        return await c.list_retained(tenant, args.filter, args.limit)
    if cmd == "delete-retained":
        return {"deleted": await c.delete_retained(tenant, args.topic)}
    if cmd == "delayed":
        return {"messages": await c.list_delayed(tenant)}
    await c.cancel_delayed(tenant, args.id)
    return {"cancelled": True}


async def _session(c: SessionAdminClient, args: argparse.Namespace) -> object:
    cmd, tenant = args.command, args.tenant
    if cmd == "user-add":
        kinds = [k for k in args.credentials.split(",") if k] if args.credentials else []
        await c.create_user(tenant, args.username, args.password, args.scheme, kinds)
        return {}
    if cmd == "user-delete":
        return {"deleted": await c.delete_user(tenant, args.username)}
    if cmd == "acl-set":
        text = Path(args.file).read_text()  # noqa: ASYNC240 - one small file
        await c.set_acl(tenant, rules_from_json(json.loads(text)))
        return {}
    if cmd == "acl-get":
        return {"rules": [rule_to_json(r) for r in await c.get_acl(tenant)]}
    if cmd == "clients":
        return {"clients": await c.list_clients(tenant)}
    if cmd == "sessions":
        return await c.list_sessions(tenant, prefix=args.prefix, after=args.after, limit=args.limit)
    if cmd == "session-discard":
        return {"discarded": await c.discard_session(tenant, args.client_id)}
    if cmd == "kick":
        await c.kick(tenant, args.client_id)
        return {"kicked": True}
    raise SystemExit(f"unknown command {cmd}")


async def _call(args: argparse.Namespace) -> object:
    token = _token(args)
    if args.command in ("rules", "autosub"):
        from services.cli.rules import run_rules

        return await run_rules(args, _address(args, "rules"), token)
    if args.command == "admin":
        tokens = TokenAdminClient(_address(args, "session"), token)
        try:
            return await _tokens(tokens, args)
        finally:
            await tokens.close()
    if args.command in ROUTER_COMMANDS:
        router = RouterAdminClient(_address(args, "router"), token)
        try:
            return await _router(router, args)
        finally:
            await router.close()
    if args.command in ("quota", "ban"):
        quota = QuotaAdminClient(_address(args, "quota"), token)
        try:
            return await quota_command(quota, args)
        finally:
            await quota.close()
    if args.command == "drain":
        return await drain_command(args, token)
    if args.command == "stats":
        metrics = MetricsAdminClient(_address(args, "metrics"), token)
        try:
            return await metrics.cluster_stats()
        finally:
            await metrics.close()
    session = SessionAdminClient(_address(args, "session"), token)
    try:
        return await _session(session, args)
    finally:
        await session.close()


def add_admin_commands(sub: Any) -> None:
    """Register the admin subcommands on `sub` (the CLI's argparse subparsers)."""
    # Registration order is the order `starling --help` lists the commands in.
    _add_session_commands(sub)
    _add_router_commands(sub)
    p = sub.add_parser("stats", help="cluster statistics from the metrics service")
    _add_common_options(p)
    p.add_argument("--metrics-addr", help="metrics service gRPC address")
    _add_token_commands(sub)
    add_drain_command(sub, _add_common_options)
    add_quota_commands(sub, _add_common_options, parse_ttl)


def _add_token_commands(sub: Any) -> None:
    """`starling admin token create|list|revoke`: tenant-scoped admin tokens (operator)."""
    admin = sub.add_parser("admin", help="tenant-scoped admin tokens (operator token only)")
    groups = admin.add_subparsers(dest="admin_command", required=True)
    token = groups.add_parser("token", help="create, list or revoke tenant admin tokens")
    commands = token.add_subparsers(dest="token_command", required=True)
    p = commands.add_parser("create", help="a token that administers one tenant; printed once")
    _add_common_options(p)
    p.add_argument("--tenant", required=True)
    p.add_argument("--ttl", type=parse_ttl, default="30d", help="lifetime: 3600, 90m, 12h, 30d")
    p.add_argument("--description", default="", help="what the token is for")
    p = commands.add_parser("list", help="tokens (never their secrets) with expiry")
    _add_common_options(p)
    p.add_argument("--tenant", help="only this tenant's")
    p = commands.add_parser("revoke", help="revoke a token by id")
    _add_common_options(p)
    p.add_argument("token_id")


class _RefuseArgvToken(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.error(
            "--token is no longer accepted (the command line shows in ps and shell history); "
            "set STARLING_ADMIN_TOKEN or use --token-file"
        )


def _add_common_options(p: argparse.ArgumentParser) -> None:
    """Options of every admin command: where the services are, and the admin token."""
    p.add_argument("--data-dir", default=".starling", help="local mesh to talk to")
    p.add_argument("--session-addr", help="session service gRPC address")
    p.add_argument(
        "--token-file",
        help="file holding the admin token (default: <data-dir>/secrets/admin-token, written "
        "by `starling up`); STARLING_ADMIN_TOKEN wins over it",
    )
    p.add_argument("--token", nargs="?", action=_RefuseArgvToken, help=argparse.SUPPRESS)


def _add_session_command(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    """A command answered by the session service, on one tenant."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
    _add_common_options(p)
    p.add_argument("--tenant", default="default")
    return p


def _add_session_commands(sub: Any) -> None:
    p = _add_session_command(sub, "user-add", "create or replace a user")
    p.add_argument("--username", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--scheme", default="argon2", choices=["argon2", "bcrypt"])
    p.add_argument(
        "--credentials",
        default="",
        help="comma-separated: hash, scram-sha-256, scram-sha-512 (default: all three)",
    )
    p = _add_session_command(sub, "user-delete", "delete a user")
    p.add_argument("--username", required=True)
    p = _add_session_command(sub, "acl-set", "replace a tenant's ACL with rules from a JSON file")
    p.add_argument("--file", required=True, help="JSON list of AclRule objects")
    _add_session_command(sub, "acl-get", "show a tenant's ACL")
    _add_session_command(sub, "clients", "list connected clients of a tenant")
    p = _add_session_command(sub, "sessions", "a page of a tenant's offline sessions, with depth")
    p.add_argument("--prefix", default="", help="client ids starting with this")
    p.add_argument("--after", default="", help="the `next` of the previous page")
    p.add_argument("--limit", type=int, default=0)
    p = _add_session_command(sub, "session-discard", "end an offline session and its queue")
    p.add_argument("--client-id", required=True)
    p = _add_session_command(sub, "kick", "disconnect a client (any node)")
    p.add_argument("--client-id", required=True)


def _add_router_command(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    """A command answered by the router service, on one tenant."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_)
    _add_common_options(p)
    p.add_argument("--router-addr", help="router service gRPC address")
    p.add_argument("--tenant", default="default")
    return p


def _add_router_commands(sub: Any) -> None:
    _add_router_command(
        sub, "routes", "a tenant's filters with their nodes, and persistent ones with sessions"
    )
    p = _add_router_command(sub, "retained", "retained messages matching a filter")
    p.add_argument("--filter", default="#")
    p.add_argument("--limit", type=page_limit, default=100)
    p = _add_router_command(sub, "delete-retained", "delete one retained message")
    p.add_argument("--topic", required=True)
    _add_router_command(sub, "delayed", "delayed messages waiting to be published")
    p = _add_router_command(sub, "cancel-delayed", "cancel a delayed message")
    p.add_argument("--id", required=True)


async def admin_command(args: argparse.Namespace) -> tuple[int, str]:
    """Run one admin command: (exit status, what to print)."""
    try:
        reply = await _call(args)
    except (TokenError, NodeNotFoundError) as exc:
        return 2, f"starling {args.command}: {exc}"
    except ServiceError as exc:
        return 1, f"starling {args.command}: {exc.code.name}: {exc.details}"
    except (OSError, ValueError) as exc:  # an input file: unreadable or not JSON
        return 1, f"starling {args.command}: {exc}"
    return 0, to_json(reply)


def run_admin(args: argparse.Namespace) -> int:
    status, text = asyncio.run(admin_command(args))
    print(text)
    return status
