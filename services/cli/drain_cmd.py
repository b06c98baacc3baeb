"""`starling drain NODE`: ask one connection node to drain (docs/operations.md).

The node does the work and keeps the state: this command only asks (again, if run again:
the node answers how far it got), so a CLI or a hook that dies half-way changes nothing.
With `--wait` it asks again every half second until the node has exited.

Every `starling` command registers this one's arguments, so the node's admin client (gRPC)
and asyncio are imported only when a drain runs."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from services.cli.mesh import Mesh

POLL_S = 0.5


class NodeNotFoundError(Exception):
    """NODE is not a connection node of the local mesh and no --node-addr was given."""


def add_drain_command(sub: Any, common: Any) -> None:
    """`common(p)` adds the options every admin command has."""
    p = sub.add_parser(
        "drain",
        help="take a connection node out of service: no new connections, clients sent "
        "elsewhere (MQTT 5: DISCONNECT 0x9C), then the node exits",
    )
    common(p)
    p.add_argument(
        "node", help="node id in the local mesh (e.g. connection-1); a label with --node-addr"
    )
    p.add_argument("--node-addr", help="the node's gRPC address (outside a local mesh)")
    p.add_argument(
        "--server-reference",
        default="",
        help="where MQTT 5 clients should go (default: the node's drain_server_reference)",
    )
    p.add_argument("--wait", action="store_true", help="return once the node has exited")
    p.add_argument(
        "--wait-timeout", type=float, default=3600.0, help="give up waiting after this (s)"
    )


def node_address(args: argparse.Namespace) -> str:
    if args.node_addr:
        return str(args.node_addr)
    try:
        mesh = Mesh.load(str(Path(args.data_dir).resolve()))
        comp = mesh.by_name(args.node)
    except (FileNotFoundError, StopIteration):
        raise NodeNotFoundError(
            f"no connection node {args.node!r} in {args.data_dir}/mesh.json; "
            "pass --node-addr host:port"
        ) from None
    if not comp.name.startswith("connection-"):
        raise NodeNotFoundError(f"{args.node!r} is not a connection node")
    return f"127.0.0.1:{comp.grpc_port}"


async def drain_command(args: argparse.Namespace, token: str) -> object:
    address = node_address(args)  # a node that is not there: said before gRPC loads
    import asyncio

    from services.common.rpc.errors import UnavailableError
    from services.connection.client import ConnectionAdminClient

    client = ConnectionAdminClient(address, token)
    try:
        progress = await client.drain(args.server_reference)
        if not args.wait:
            return progress
        first = progress
        deadline = time.monotonic() + args.wait_timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            try:
                progress = await client.drain()
            except UnavailableError:  # gone: the drain is over
                return {**dataclasses.asdict(progress), "started": first.started, "exited": True}
        return {**dataclasses.asdict(progress), "started": first.started, "exited": False}
    finally:
        await client.close()
