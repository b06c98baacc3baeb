"""The overview: live charts of the last hour (connections, messages in and out per second,
drops per second; instances serving) drawn from the sampler's history in Redis, with the
nodes, every service instance's health and each tenant's figures for the operator. The live
part is a fragment (`/overview/live`) that htmx fetches again every few seconds.

A tenant token sees its own tenant's charts only: no nodes, instances or other tenants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.common.rpc.errors import ServiceError
from services.console.chart import Chart, chart
from services.console.series import ClusterSample, Counts, Rate, TenantSample, node_points, rates
from services.console.signin import now_ms
from services.console.web import Ctx, render, signed_in

REFRESH_S = 5
TENANTS_SHOWN = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One line of a table: a name, its state and its latest figures and rates."""

    name: str
    status: str
    counts: Counts | None
    rate: Rate | None


def _latest_rate(points: Sequence[tuple[int, Counts]]) -> Rate | None:
    found = rates(points[-2:])
    return found[-1] if found else None


def _charts(prefix: str, points: Sequence[tuple[int, Counts]], span_s: int) -> list[Chart]:
    now = now_ms()
    r = rates(points)

    def make(chart_id: str, title: str, unit: str, *series: Any) -> Chart:
        return chart(
            chart_id=f"{prefix}-{chart_id}",
            title=title,
            unit=unit,
            series=series,
            now_ms=now,
            span_s=span_s,
        )

    return [
        make("connections", "Connections", "", ("connections", _of(points, "connections"))),
        make(
            "messages",
            "Messages per second",
            "msg/s",
            ("in", [(x.at_ms, x.messages_in) for x in r]),
            ("out", [(x.at_ms, x.messages_out) for x in r]),
        ),
        make("drops", "Drops per second", "msg/s", ("dropped", [(x.at_ms, x.dropped) for x in r])),
    ]


def _of(points: Sequence[tuple[int, Counts]], field: str) -> list[tuple[int, float]]:
    return [(t, float(getattr(c, field))) for t, c in points]


def _cluster_view(samples: Sequence[ClusterSample], span_s: int) -> dict[str, Any]:
    points = [(s.at_ms, s.totals) for s in samples]
    charts = _charts("cluster", points, span_s)
    serving = [(s.at_ms, float(sum(i.status == "SERVING" for i in s.instances))) for s in samples]
    total = [(s.at_ms, float(len(s.instances))) for s in samples]
    charts.append(
        chart(
            chart_id="cluster-instances",
            title="Instances serving",
            unit="",
            series=[("serving", serving), ("known", total)],
            now_ms=now_ms(),
            span_s=span_s,
        )
    )
    latest = samples[-1] if samples else None
    nodes = [
        Row(
            name=i.name,
            status=i.status,
            counts=i.counts,
            rate=_latest_rate(node_points(samples[-2:], i.name)),
        )
        for i in (latest.instances if latest else ())
        if i.service == "connection"
    ]
    return {
        "cluster_charts": charts,
        "latest": latest,
        "node_rows": nodes,
        "instances": latest.instances if latest else (),
    }


async def _tenant_rows(ctx: Ctx) -> tuple[list[Row], int, str]:
    """Every tenant's current figures (the metrics service) and rates (the history)."""
    try:
        totals = await ctx.clients.metrics.cluster_stats()
    except ServiceError as exc:
        return [], 0, str(exc)
    ranked = sorted(totals.tenants, key=lambda t: (-t.connections, t.tenant))[:TENANTS_SHOWN]
    recent = await ctx.console.history.latest([t.tenant for t in ranked])
    rows = []
    for t in ranked:
        samples: list[TenantSample] = recent.get(t.tenant, [])
        counts = Counts(
            connections=t.connections,
            messages_in=t.messages_in,
            messages_out=t.messages_out,
            dropped=t.messages_dropped,
            sessions=t.sessions_persistent,
        )
        rate = _latest_rate([(s.at_ms, s.counts) for s in samples])
        rows.append(Row(name=t.tenant, status="", counts=counts, rate=rate))
    return rows, totals.nodes, ""


async def live_values(ctx: Ctx) -> dict[str, Any]:
    history = ctx.console.history
    out: dict[str, Any] = {"refresh_s": REFRESH_S, "span_min": history.span_s // 60}
    if ctx.principal.operator:
        out.update(_cluster_view(await history.cluster(), history.span_s))
        rows, nodes, error = await _tenant_rows(ctx)
        out.update(tenant_rows=rows, nodes_reporting=nodes, stats_error=error)
    if ctx.tenant:
        samples = await history.tenant(ctx.tenant)
        points = [(s.at_ms, s.counts) for s in samples]
        out["tenant_charts"] = _charts("tenant", points, history.span_s)
        out["tenant_now"] = points[-1][1] if points else None
        out["tenant_rate"] = _latest_rate(points)
    return out


async def overview(request: web.Request) -> web.StreamResponse:
    ctx = await signed_in(request)
    return render(request, "overview.html", ctx, **await live_values(ctx))


async def live(request: web.Request) -> web.StreamResponse:
    """The live part of the overview alone (htmx swaps it in every REFRESH_S)."""
    ctx = await signed_in(request)
    return render(request, "overview_live.html", ctx, **await live_values(ctx))
