"""Admin subcommands over the gRPC admin APIs (users, ACLs, clients, kick, stats)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict, ParseDict

from services.cli.launcher import Mesh
from starling.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from starling.router.v1 import router_pb2 as rpb
from starling.router.v1 import router_pb2_grpc as rgrpc
from starling.session.v1 import session_pb2 as spb
from starling.session.v1 import session_pb2_grpc as sgrpc


def _address(args: argparse.Namespace, service: str) -> str:
    explicit = getattr(args, f"{service}_addr", None)
    if explicit:
        return str(explicit)
    try:
        mesh = Mesh.load(str(Path(args.data_dir).resolve()))
        return f"127.0.0.1:{mesh.by_name(service).grpc_port}"
    except (FileNotFoundError, StopIteration):
        return os.environ.get(f"STARLING_{service.upper()}_ADDR", "127.0.0.1:7001")


def _metadata(args: argparse.Namespace) -> list[tuple[str, str]]:
    token = args.token or os.environ.get("STARLING_ADMIN_TOKEN", "")
    return [("authorization", f"Bearer {token}")] if token else []


async def _call(args: argparse.Namespace) -> Any:
    md = _metadata(args)
    cmd = args.command
    if cmd in ("routes", "retained", "delete-retained", "delayed", "cancel-delayed"):
        async with grpc.aio.insecure_channel(_address(args, "router")) as ch:
            r = rgrpc.RouterAdminServiceStub(ch)
            if cmd == "routes":
                return await r.ListRoutes(rpb.ListRoutesRequest(tenant=args.tenant), metadata=md)
            if cmd == "retained":
                return await r.ListRetained(
                    rpb.ListRetainedRequest(
                        tenant=args.tenant, topic_filter=args.filter, limit=args.limit
                    ),
                    metadata=md,
                )
            if cmd == "delete-retained":
                return await r.DeleteRetained(
                    rpb.DeleteRetainedRequest(tenant=args.tenant, topic=args.topic), metadata=md
                )
            if cmd == "delayed":
                return await r.ListDelayed(rpb.ListDelayedRequest(tenant=args.tenant), metadata=md)
            return await r.CancelDelayed(
                rpb.CancelDelayedRequest(tenant=args.tenant, id=args.id), metadata=md
            )
    if cmd == "stats":
        async with grpc.aio.insecure_channel(_address(args, "metrics")) as ch:
            stub = metrics_pb2_grpc.MetricsAdminServiceStub(ch)
            return await stub.GetClusterStats(metrics_pb2.GetClusterStatsRequest(), metadata=md)
    async with grpc.aio.insecure_channel(_address(args, "session")) as ch:
        s = sgrpc.SessionAdminServiceStub(ch)
        if cmd == "user-add":
            return await s.CreateUser(
                spb.CreateUserRequest(
                    tenant=args.tenant,
                    username=args.username,
                    password=args.password,
                    hash_scheme=args.scheme,
                ),
                metadata=md,
            )
        if cmd == "user-delete":
            return await s.DeleteUser(
                spb.DeleteUserRequest(tenant=args.tenant, username=args.username), metadata=md
            )
        if cmd == "acl-set":
            rules = json.loads(Path(args.file).read_text())  # noqa: ASYNC240 - one small file
            req = ParseDict({"tenant": args.tenant, "rules": rules}, spb.SetAclRequest())
            return await s.SetAcl(req, metadata=md)
        if cmd == "acl-get":
            return await s.GetAcl(spb.GetAclRequest(tenant=args.tenant), metadata=md)
        if cmd == "clients":
            return await s.ListClients(spb.ListClientsRequest(tenant=args.tenant), metadata=md)
        if cmd == "kick":
            return await s.KickClient(
                spb.KickClientRequest(tenant=args.tenant, client_id=args.client_id), metadata=md
            )
    raise SystemExit(f"unknown command {cmd}")


def add_admin_commands(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", default=".starling", help="local mesh to talk to")
        p.add_argument("--session-addr", help="session service gRPC address")
        p.add_argument("--token", help="admin token (or STARLING_ADMIN_TOKEN)")

    p = sub.add_parser("user-add", help="create or replace a user")
    common(p)
    p.add_argument("--tenant", default="default")
    p.add_argument("--username", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--scheme", default="argon2", choices=["argon2", "bcrypt"])
    p = sub.add_parser("user-delete", help="delete a user")
    common(p)
    p.add_argument("--tenant", default="default")
    p.add_argument("--username", required=True)
    p = sub.add_parser("acl-set", help="replace a tenant's ACL with rules from a JSON file")
    common(p)
    p.add_argument("--tenant", default="default")
    p.add_argument("--file", required=True, help="JSON list of AclRule objects")
    for name, help_ in (
        ("acl-get", "show a tenant's ACL"),
        ("clients", "list connected clients of a tenant"),
    ):
        p = sub.add_parser(name, help=help_)
        common(p)
        p.add_argument("--tenant", default="default")
    p = sub.add_parser("kick", help="disconnect a client (any node)")
    common(p)
    p.add_argument("--tenant", default="default")
    p.add_argument("--client-id", required=True)

    def router_cmd(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        common(p)
        p.add_argument("--router-addr", help="router service gRPC address")
        p.add_argument("--tenant", default="default")
        return p

    router_cmd("routes", "a tenant's filters with their nodes, and persistent ones with sessions")
    p = router_cmd("retained", "retained messages matching a filter")
    p.add_argument("--filter", default="#")
    p.add_argument("--limit", type=int, default=100)
    p = router_cmd("delete-retained", "delete one retained message")
    p.add_argument("--topic", required=True)
    router_cmd("delayed", "delayed messages waiting to be published")
    p = router_cmd("cancel-delayed", "cancel a delayed message")
    p.add_argument("--id", required=True)
    p = sub.add_parser("stats", help="cluster statistics from the metrics service")
    common(p)
    p.add_argument("--metrics-addr", help="metrics service gRPC address")


def run_admin(args: argparse.Namespace) -> int:
    try:
        reply = asyncio.run(_call(args))
    except grpc.aio.AioRpcError as exc:
        print(f"starling {args.command}: {exc.code().name}: {exc.details()}")
        return 1
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))
    return 0
