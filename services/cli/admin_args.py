"""The admin subcommands' arguments (users, ACLs, clients, kick, routes, retained and delayed
messages, stats, tenant admin tokens, node drain, quotas and bans) and the options they all
have: where the services are and where the admin token comes from.

Argparse only: every `starling` command builds the whole parser, so this module imports no
client, gRPC or protobuf (services/cli/admin.py, imported when an admin command runs, does
the calls)."""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.drain_cmd import add_drain_command
from services.cli.quota_cmd import add_quota_commands

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


def add_admin_commands(sub: Any) -> None:
    """Register the admin subcommands on `sub` (the CLI's argparse subparsers)."""
    # Registration order is the order `starling --help` lists the commands in.
    _add_session_commands(sub)
    _add_router_commands(sub)
    p = sub.add_parser("stats", help="cluster statistics from the metrics service")
    add_common_options(p)
    p.add_argument("--metrics-addr", help="metrics service gRPC address")
    _add_token_commands(sub)
    add_drain_command(sub, add_common_options)
    add_quota_commands(sub, add_common_options, parse_ttl)


def _add_token_commands(sub: Any) -> None:
    """`starling admin token create|list|revoke`: tenant-scoped admin tokens (operator)."""
    admin = sub.add_parser("admin", help="tenant-scoped admin tokens (operator token only)")
    groups = admin.add_subparsers(dest="admin_command", required=True)
    token = groups.add_parser("token", help="create, list or revoke tenant admin tokens")
    commands = token.add_subparsers(dest="token_command", required=True)
    p = commands.add_parser("create", help="a token that administers one tenant; printed once")
    add_common_options(p)
    p.add_argument("--tenant", required=True)
    p.add_argument("--ttl", type=parse_ttl, default="30d", help="lifetime: 3600, 90m, 12h, 30d")
    p.add_argument("--description", default="", help="what the token is for")
    p = commands.add_parser("list", help="tokens (never their secrets) with expiry")
    add_common_options(p)
    p.add_argument("--tenant", help="only this tenant's")
    p = commands.add_parser("revoke", help="revoke a token by id")
    add_common_options(p)
    p.add_argument("token_id")


class _RefuseArgvToken(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.error(
            "--token is no longer accepted (the command line shows in ps and shell history); "
            "set STARLING_ADMIN_TOKEN or use --token-file"
        )


def add_common_options(p: argparse.ArgumentParser) -> None:
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
    add_common_options(p)
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
    add_common_options(p)
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
