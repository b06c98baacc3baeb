"""Tenant report: per tenant and hour, the usage the metrics service recorded (the `usage`
table: services/metrics/usage.py) summed over nodes -> `usage.parquet` (partitioned by
tenant) and `report.html`, one self-contained page of Plotly charts (plotly.js inlined, so it
opens offline in any browser).

Figures: peak connections (the sum of each node's peak in the hour), connection minutes,
messages in, messages out, drops. Idempotent: each run rewrites both outputs for its window.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analytics.jobs.context import JobContext

HELP = "per tenant and hour usage figures -> Parquet and an HTML report with charts"
FIGURES = ("connections_peak", "connection_minutes", "messages_in", "messages_out", "dropped")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since-ms", type=int, default=0, help="first hour (epoch ms; default all)")
    p.add_argument("--until-ms", type=int, default=0, help="end, exclusive (default: no end)")
    p.add_argument("--tenant", action="append", default=[], help="only these tenants")


def hourly(ctx: JobContext, args: argparse.Namespace) -> Any:
    """The per tenant and hour DataFrame (filters pushed down to the store scan)."""
    from pyspark.sql import functions as f

    usage = ctx.table("usage")
    if args.since_ms:
        usage = usage.where(f.col("hour_ms") >= args.since_ms)
    if args.until_ms:
        usage = usage.where(f.col("hour_ms") < args.until_ms)
    if args.tenant:
        usage = usage.where(f.col("tenant").isin(list(args.tenant)))
    return (
        usage.groupBy("tenant", "hour_ms")
        .agg(
            f.sum("connections_max").alias("connections_peak"),
            (f.sum("connection_ms") / 60000.0).alias("connection_minutes"),
            f.sum("messages_in").alias("messages_in"),
            f.sum("messages_out").alias("messages_out"),
            f.sum("dropped").alias("dropped"),
        )
        .withColumn("hour", f.timestamp_millis("hour_ms"))
        .orderBy("tenant", "hour_ms")
    )


def write_html(rows: list[dict[str, Any]], path: Path) -> None:
    """One chart per figure, a trace per tenant, hours on the x axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = [
        "Peak connections",
        "Connection minutes",
        "Messages in",
        "Messages out",
        "Dropped deliveries",
    ]
    fig = make_subplots(rows=len(FIGURES), cols=1, subplot_titles=titles, shared_xaxes=True)
    tenants = sorted({r["tenant"] for r in rows})
    for i, figure in enumerate(FIGURES, start=1):
        for t in tenants:
            mine = [r for r in rows if r["tenant"] == t]
            fig.add_trace(
                go.Bar(
                    x=[r["hour"] for r in mine],
                    y=[r[figure] for r in mine],
                    name=t,
                    legendgroup=t,
                    showlegend=i == 1,
                ),
                row=i,
                col=1,
            )
    fig.update_layout(
        title="Starling tenant usage per hour (UTC)", barmode="group", height=300 * len(FIGURES)
    )
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def run(ctx: JobContext, args: argparse.Namespace) -> dict[str, Any]:
    df = hourly(ctx, args)
    parquet = ctx.output_dir / "usage.parquet"
    df.write.mode("overwrite").partitionBy("tenant").parquet(str(parquet))
    rows = [r.asDict() for r in df.collect()]  # one row per tenant and hour: small
    html = ctx.output_dir / "report.html"
    write_html(rows, html)
    totals: dict[str, dict[str, float]] = {}
    for r in rows:
        t = totals.setdefault(r["tenant"], dict.fromkeys(FIGURES, 0))
        for k in FIGURES:
            t[k] += r[k] or 0
    return {"parquet": str(parquet), "html": str(html), "hours": len(rows), "totals": totals}
