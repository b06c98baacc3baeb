"""Operations (operator only; a tenant token gets 403 and no link): the connection nodes with
their health and open connections, and draining one (the node's Drain admin API, as `starling
drain` asks) after a confirmation, with its progress: clients left on the node, refreshed,
until the node has exited. Every drain asked for is in the audit log (`node_drain`).

Looking never drains: the progress comes from the node's GetNodeStats and health, and a
drain begun here is remembered in Redis (services/console/drains.py) so any replica shows it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from services.common.rpc.errors import ServiceError
from services.common.rpc.server import check_health
from services.connection.client import ConnectionAdminClient
from services.console.drains import DrainRecord
from services.console.instances import Instance, node_figures
from services.console.signin import now_ms
from services.console.web import Ctx, back, changing, render, signed_in

REFRESH_S = 2
# A node that serves again this long after its drain began was started again: the drain is
# over. (Sooner, SERVING is the moment before the node stopped accepting.)
RESTARTED_AFTER_MS = 30_000
HEALTH_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    name: str
    address: str
    health: str
    connections: int | None  # None: the node did not answer
    phase: str  # "serving", "draining", "exited", or the health of a node not drained
    drain: DrainRecord | None


def _operator(ctx: Ctx) -> None:
    if not ctx.principal.operator:
        raise web.HTTPForbidden(text="Operations are the operator's only.")


def _phase(health: str, drain: DrainRecord | None, now: int) -> str:
    if drain is None:
        return "serving" if health == "SERVING" else health.lower()
    if health == "UNREACHABLE":
        return "exited"
    if health == "SERVING" and now - drain.started_at_ms > RESTARTED_AFTER_MS:
        return "serving"
    return "draining"


async def _state(ctx: Ctx, node: Instance) -> NodeState:
    health = await check_health(node.address, timeout_s=HEALTH_TIMEOUT_S)
    figures = None
    if health != "UNREACHABLE":
        figures = await node_figures(node.address, ctx.principal.token)
    drain = await ctx.console.drains.find(node.name)
    phase = _phase(health, drain, now_ms())
    if drain is not None and phase == "serving":
        await ctx.console.drains.forget(node.name)  # started again since: a fresh node
        drain = None
    return NodeState(
        name=node.name,
        address=node.address,
        health=health,
        connections=figures.connections if figures else None,
        phase=phase,
        drain=drain,
    )


async def _states(ctx: Ctx) -> list[NodeState]:
    nodes = ctx.console.directory.nodes()
    return list(await asyncio.gather(*(_state(ctx, n) for n in nodes)))


async def operations(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    _operator(ctx)
    states = await _states(ctx)
    return render(request, "operations.html", ctx, states=states, refresh_s=REFRESH_S)


async def live(request: web.Request) -> web.StreamResponse:
    """The node table alone (htmx swaps it in every REFRESH_S)."""
    ctx = await signed_in(request)
    _operator(ctx)
    states = await _states(ctx)
    return render(request, "operations_live.html", ctx, states=states, refresh_s=REFRESH_S)


async def drain(request: web.Request) -> web.StreamResponse:
    ctx, form = await changing(request)
    _operator(ctx)
    name, reference = form.get("node", ""), form.get("server_reference", "").strip()
    node = ctx.console.directory.node(name)
    if node is None:
        await ctx.audit("node_drain", f"node {name}", outcome="refused: no such node")
        raise back("/operations", ctx, msg=f"No connection node {name}")
    client = ConnectionAdminClient(node.address, ctx.principal.token)
    try:
        progress = await client.drain(reference)
    except ServiceError as exc:
        await ctx.audit("node_drain", f"node {name}", outcome=f"failed: {exc}")
        raise back("/operations", ctx, msg=f"Drain of {name} failed: {exc}") from None
    finally:
        await client.close()
    record = DrainRecord(
        node=name,
        started_at_ms=now_ms(),
        by=ctx.principal.name,
        server_reference=progress.server_reference,
    )
    if progress.started or await ctx.console.drains.find(name) is None:
        await ctx.console.drains.begun(record)
    detail = (
        f"{progress.connections} connections open; clients told "
        f"{progress.server_reference or '(no server reference)'}"
    )
    outcome = "ok" if progress.started else "ok: already draining"
    await ctx.audit("node_drain", f"node {name}", detail=detail, outcome=outcome)
    verb = "Draining" if progress.started else "Already draining"
    raise back("/operations", ctx, msg=f"{verb} {name}")
