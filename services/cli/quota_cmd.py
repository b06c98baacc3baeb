"""`starling quota set|get` (tenant and user limits) and `starling ban add|list|remove` (the
ban list), over the quota service's admin client. Every `starling` command registers these
arguments, so the client is not imported here: the caller (services/cli/admin.py) passes it."""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import TYPE_CHECKING, Any

from services.common.bans import KIND_NAMES, Ban, BanKind
from services.common.tenant_limits import Limits

if TYPE_CHECKING:
    from services.quota.client import QuotaAdminClient

_LIMIT_FLAGS = tuple(f.name for f in dataclasses.fields(Limits))
_KIND_OF_NAME = {v: k for k, v in KIND_NAMES.items()}


def add_quota_commands(sub: Any, common: Any, parse_ttl: Any) -> None:
    """`common(p)` adds the options every admin command has; `parse_ttl` reads "10m"."""
    quota = sub.add_parser("quota", help="tenant and user limits (quota service)")
    cmds = quota.add_subparsers(dest="quota_command", required=True)
    p = cmds.add_parser("set", help="set limits; limits not named keep their value (0: none)")
    common(p)
    p.add_argument("--quota-addr", help="quota service gRPC address")
    p.add_argument("--tenant", required=True)
    p.add_argument("--user", default="", help="limits of this user of the tenant")
    for name in _LIMIT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), type=int, dest=name, metavar="N")
    p = cmds.add_parser("get", help="a tenant's (or a user's) limits")
    common(p)
    p.add_argument("--quota-addr", help="quota service gRPC address")
    p.add_argument("--tenant", required=True)
    p.add_argument("--user", default="")

    ban = sub.add_parser("ban", help="the cluster-wide ban list (quota service)")
    cmds = ban.add_subparsers(dest="ban_command", required=True)
    p = cmds.add_parser("add", help="ban a client id, user or address (IP or CIDR)")
    common(p)
    p.add_argument("--quota-addr", help="quota service gRPC address")
    p.add_argument("kind", choices=sorted(KIND_NAMES))
    p.add_argument("value")
    p.add_argument("--tenant", default="", help="required for client-id and user bans")
    p.add_argument("--for", dest="duration", type=parse_ttl, help="expiry: 3600, 90m, 12h, 30d")
    p.add_argument("--reason", default="")
    p = cmds.add_parser("list", help="bans in force")
    common(p)
    p.add_argument("--quota-addr", help="quota service gRPC address")
    p = cmds.add_parser("remove", help="lift a ban")
    common(p)
    p.add_argument("--quota-addr", help="quota service gRPC address")
    p.add_argument("kind", choices=sorted(KIND_NAMES))
    p.add_argument("value")
    p.add_argument("--tenant", default="")


def ban_json(b: Ban) -> dict[str, object]:
    out: dict[str, object] = {
        "kind": _KIND_OF_NAME[BanKind(b.kind)],
        "tenant": b.tenant,
        "value": b.value,
        "reason": b.reason,
        "source": b.source,
        "created_at": _iso(b.created_at_ms),
        "expires_at": _iso(b.expires_at_ms) if b.expires_at_ms else None,
    }
    return out


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


async def quota_command(c: QuotaAdminClient, args: argparse.Namespace) -> object:
    if args.command == "quota":
        if args.quota_command == "get":
            return dataclasses.asdict(await c.get_limits(args.tenant, args.user))
        current = await c.get_limits(args.tenant, args.user)
        given = {n: getattr(args, n) for n in _LIMIT_FLAGS if getattr(args, n) is not None}
        if any(v < 0 for v in given.values()):
            raise ValueError("limits are 0 (none) or more")
        limits = dataclasses.replace(current, **given)
        await c.set_limits(args.tenant, limits, args.user)
        return dataclasses.asdict(limits)
    if args.ban_command == "add":
        ban = Ban(
            kind=KIND_NAMES[args.kind], tenant=args.tenant, value=args.value, reason=args.reason
        )
        return ban_json(await c.add_ban(ban, args.duration or 0))
    if args.ban_command == "list":
        return {"bans": [ban_json(b) for b in await c.list_bans()]}
    return {"removed": await c.remove_ban(KIND_NAMES[args.kind], args.tenant, args.value)}
