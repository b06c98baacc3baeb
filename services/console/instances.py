"""Which service instances the console watches and drains, and how each one is doing.

Where the instances are: in a local mesh, `mesh.json` (`console_mesh_file`, which `starling
up` sets), read again on every look so restarted or added components are seen; elsewhere the
console's own settings: every address of `session_addr`, `router_addr`, ... (the launcher and
the deploy files list each instance there) and the connection nodes' admin addresses in
`console_nodes` (`name=host:port`). How each is doing: its gRPC health (what `starling status`
asks) and, for a connection node, its own connections and counters (GetNodeStats)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.common.rpc.errors import ServiceError
from services.common.rpc.server import check_health
from services.connection.client import ConnectionAdminClient, NodeFigures
from services.console.series import Counts, InstanceHealth

NODE_SERVICE = "connection"
HEALTH_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    name: str  # e.g. "connection-0", "router-1"
    service: str
    address: str  # its gRPC host:port


def _service_of(name: str) -> str:
    return name.rsplit("-", 1)[0] if "-" in name else name


def from_mesh_file(path: Path) -> list[Instance]:
    """The service components of a local mesh's mesh.json (NATS and Redis left out)."""
    raw = json.loads(path.read_text())
    return [
        Instance(
            name=c["name"],
            service=c.get("service") or _service_of(c["name"]),
            address=f"127.0.0.1:{c['grpc_port']}",
        )
        for c in raw.get("components", [])
        if c.get("kind") == "service" and c.get("grpc_port")
    ]


def from_settings(addresses: Mapping[str, str], nodes: Sequence[str]) -> list[Instance]:
    """Each address of each service's comma-separated list, and `name=host:port` nodes."""
    out = []
    for service, joined in addresses.items():
        for i, addr in enumerate(a.strip() for a in joined.split(",") if a.strip()):
            out.append(Instance(name=f"{service}-{i}", service=service, address=addr))
    for entry in nodes:
        name, _, addr = entry.partition("=")
        out.append(Instance(name=name.strip(), service=NODE_SERVICE, address=addr.strip()))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Directory:
    """The instances the console knows about (see the module's docstring)."""

    mesh_file: str
    configured: tuple[Instance, ...]

    def instances(self) -> list[Instance]:
        if self.mesh_file:
            try:
                return from_mesh_file(Path(self.mesh_file))
            except (OSError, ValueError, KeyError):
                pass  # between a launcher's writes, or gone: fall back to the settings
        return list(self.configured)

    def nodes(self) -> list[Instance]:
        return [i for i in self.instances() if i.service == NODE_SERVICE]

    def node(self, name: str) -> Instance | None:
        return next((i for i in self.nodes() if i.name == name), None)


def counts_of(f: NodeFigures) -> Counts:
    return Counts(
        connections=f.connections,
        messages_in=f.messages_in,
        messages_out=f.messages_out,
        dropped=f.messages_dropped,
    )


async def node_figures(address: str, token: str) -> NodeFigures | None:
    """A node's own figures; None if it does not answer."""
    client = ConnectionAdminClient(address, token, timeout_s=HEALTH_TIMEOUT_S)
    try:
        return await client.node_stats()
    except ServiceError:
        return None
    finally:
        await client.close()


async def probe_one(instance: Instance, token: str) -> InstanceHealth:
    status = await check_health(instance.address, timeout_s=HEALTH_TIMEOUT_S)
    counts = None
    if instance.service == NODE_SERVICE and status != "UNREACHABLE":
        figures = await node_figures(instance.address, token)
        counts = counts_of(figures) if figures is not None else None
    return InstanceHealth(
        name=instance.name, service=instance.service, status=status, counts=counts
    )


async def probe(instances: Sequence[Instance], token: str) -> tuple[InstanceHealth, ...]:
    """Every instance's health (and a node's figures), asked all at once."""
    return tuple(await asyncio.gather(*(probe_one(i, token) for i in instances)))
