"""Admin subcommands (users, ACLs, clients, kick, routes, retained and delayed messages,
stats, tenant admin tokens, node drain, quotas and bans) over the services' typed admin
clients; replies print as JSON (services/cli/render.py), failures as
`starling <command>: <STATUS>: <message>`.

The commands' arguments are services/cli/admin_args.py's: every `starling` command builds
the parser, while this module is imported only when an admin command runs, and imports the
one admin client that command calls (gRPC and protobuf come with it).

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
from typing import TYPE_CHECKING

from services.cli.drain_cmd import NodeNotFoundError, drain_command
from services.cli.mesh import Mesh
from services.cli.quota_cmd import quota_command
from services.cli.render import to_json
from services.cli.secrets import admin_token_file
from services.common.rpc.errors import ServiceError

if TYPE_CHECKING:  # each command imports its own client (the session one loads much more)
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
        from services.cli.acl_file import rules_from_json

        text = Path(args.file).read_text()  # noqa: ASYNC240 - one small file
        await c.set_acl(tenant, rules_from_json(json.loads(text)))
        return {}
    if cmd == "acl-get":
        from services.cli.acl_file import rule_to_json

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
    if args.command == "drain":
        return await drain_command(args, token)
    if args.command == "admin":
        from services.session.token_client import TokenAdminClient

        tokens = TokenAdminClient(_address(args, "session"), token)
        try:
            return await _tokens(tokens, args)
        finally:
            await tokens.close()
    if args.command in ROUTER_COMMANDS:
        from services.router.client import RouterAdminClient

        router = RouterAdminClient(_address(args, "router"), token)
        try:
            return await _router(router, args)
        finally:
            await router.close()
    return await _call_other(args, token)


async def _call_other(args: argparse.Namespace, token: str) -> object:
    """Quota and ban commands, stats, and the session service's commands."""
    if args.command in ("quota", "ban"):
        from services.quota.client import QuotaAdminClient

        quota = QuotaAdminClient(_address(args, "quota"), token)
        try:
            return await quota_command(quota, args)
        finally:
            await quota.close()
    if args.command == "stats":
        from services.metrics.client import MetricsAdminClient

        metrics = MetricsAdminClient(_address(args, "metrics"), token)
        try:
            return await metrics.cluster_stats()
        finally:
            await metrics.close()
    from services.session.client import SessionAdminClient

    session = SessionAdminClient(_address(args, "session"), token)
    try:
        return await _session(session, args)
    finally:
        await session.close()


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
