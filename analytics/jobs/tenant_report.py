"""Tenant report: per tenant and hour, the usage the metrics service recorded (the `usage`
table, on Cassandra `usage_daily` and `usage_peaks`: services/metrics/usage.py) summed over
nodes, the sessions seen in the event log, and the busiest topics (`usage_topics`) ->
`usage.parquet` (partitioned by tenant), `top_topics.parquet` and `report.html`, one
self-contained page of Plotly charts (plotly.js inlined, so it opens offline in any browser).

Figures per tenant and hour: peak connections (the sum of each node's peak in the hour),
connection minutes, sessions (distinct client ids that connected, from the `connected`
events of the event log: run the report before a routes-snapshot compaction prunes those
hours), messages and message bytes (payload + topic: services/common/message_size.py, the
figure the byte quotas limit) in and out by QoS, drops, quota refusals; per tenant the top
topics of the window (the nodes' sampled top-topics summaries, summed). Idempotent: each
run rewrites its outputs for its window.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from analytics.jobs.context import JobContext

HELP = "per tenant and hour usage figures -> Parquet and an HTML report with charts"
SUMMED = (
    "messages_in",
    "messages_out",
    "msgs_in_q0",
    "msgs_in_q1",
    "msgs_in_q2",
    "msgs_out_q0",
    "msgs_out_q1",
    "msgs_out_q2",
    "bytes_in",
    "bytes_out",
    "dropped",
    "quota_refusals",
)
FIGURES = ("connections_peak", "connection_minutes", "sessions", *SUMMED)
# (title, columns): one chart each, a bar per tenant (and column) and hour.
CHARTS = (
    ("Peak connections", ("connections_peak",)),
    ("Connection minutes", ("connection_minutes",)),
    ("Sessions (client ids that connected)", ("sessions",)),
    ("Messages in by QoS", ("msgs_in_q0", "msgs_in_q1", "msgs_in_q2")),
    ("Messages out by QoS", ("msgs_out_q0", "msgs_out_q1", "msgs_out_q2")),
    ("Message bytes in and out (payload + topic)", ("bytes_in", "bytes_out")),
    ("Dropped deliveries and quota refusals", ("dropped", "quota_refusals")),
)
TOP_TOPICS = 10  # per tenant over the window
HOUR_MS = 3_600_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since-ms", type=int, default=0, help="first hour (epoch ms; default all)")
    p.add_argument("--until-ms", type=int, default=0, help="end, exclusive (default: no end)")
    p.add_argument("--tenant", action="append", default=[], help="only these tenants")


def _window(df: Any, args: argparse.Namespace, hour: Any) -> Any:
    from pyspark.sql import functions as f

    if args.since_ms:
        df = df.where(hour >= args.since_ms)
    if args.until_ms:
        df = df.where(hour < args.until_ms)
    if args.tenant:
        df = df.where(f.col("tenant").isin(list(args.tenant)))
    return df


def sessions(ctx: JobContext, args: argparse.Namespace) -> Any:
    """Per tenant and hour, the distinct client ids with a `connected` event."""
    from pyspark.sql import functions as f

    # Cassandra keeps the log in minute slices (cassandra_eventlog.py), each row with its hour.
    table = "event_log_slices" if ctx.store.cassandra else "event_log"
    log = ctx.table(table, ["tenant", "bucket", "kind", "client_id"])
    log = log.where(f.col("kind") == "connected").withColumn("hour_ms", f.col("bucket") * HOUR_MS)
    log = _window(log, args, f.col("hour_ms"))
    return log.groupBy("tenant", "hour_ms").agg(f.countDistinct("client_id").alias("sessions"))


USAGE_KEY = ("tenant", "hour_ms", "node_id")
# What a job reads of each table (tests/analytics/test_job_columns.py checks them against the
# schema of each store): the embedded store's `usage` holds the peaks beside the counters;
# Cassandra's counter table cannot, so they are in `usage_peaks` (cassandra_usage.py).
READS_SQLITE = {"usage": (*USAGE_KEY, "connections_max", "connection_ms", *SUMMED)}
READS_CASSANDRA = {
    "usage_daily": (*USAGE_KEY, "connection_ms", *SUMMED),
    "usage_peaks": (*USAGE_KEY, "connections_max"),
}


def usage_rows(ctx: JobContext, args: argparse.Namespace) -> Any:
    """Per tenant, hour and reporter: connections_max, connection_ms and SUMMED, in the
    window (tenant and hour filters pushed down to the store scan)."""
    from pyspark.sql import functions as f

    if not ctx.store.cassandra:
        return _window(ctx.table("usage", READS_SQLITE["usage"]), args, f.col("hour_ms"))
    counters = _window(
        ctx.table("usage_daily", READS_CASSANDRA["usage_daily"]), args, f.col("hour_ms")
    )
    peaks = _window(
        ctx.table("usage_peaks", READS_CASSANDRA["usage_peaks"]), args, f.col("hour_ms")
    )
    return counters.join(peaks, list(USAGE_KEY), "left")


def hourly(ctx: JobContext, args: argparse.Namespace) -> Any:
    """The per tenant and hour DataFrame."""
    from pyspark.sql import functions as f

    usage = usage_rows(ctx, args)
    summed = usage.groupBy("tenant", "hour_ms").agg(
        f.sum("connections_max").alias("connections_peak"),
        (f.sum("connection_ms") / 60000.0).alias("connection_minutes"),
        *(f.sum(c).alias(c) for c in SUMMED),
    )
    return (
        summed.join(sessions(ctx, args), ["tenant", "hour_ms"], "full_outer")
        .fillna(0, ["connections_peak", "connection_minutes", "sessions", *SUMMED])
        .withColumn("hour", f.timestamp_millis("hour_ms"))
        .orderBy("tenant", "hour_ms")
    )


def top_topics(ctx: JobContext, args: argparse.Namespace) -> Any:
    """Per tenant, its TOP_TOPICS busiest topics over the window (messages, rank)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    topics = _window(ctx.table("usage_topics"), args, f.col("hour_ms"))
    per = topics.groupBy("tenant", "topic").agg(f.sum("messages").alias("messages"))
    rank = f.row_number().over(
        Window.partitionBy("tenant").orderBy(f.desc("messages"), f.asc("topic"))
    )
    return per.withColumn("rank", rank).where(f.col("rank") <= TOP_TOPICS).orderBy("tenant", "rank")


def write_html(rows: list[dict[str, Any]], topics: list[dict[str, Any]], path: Path) -> None:
    """One chart per entry of CHARTS (hours on the x axis) and one of the top topics."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = [title for title, _ in CHARTS] + ["Top topics over the window (messages)"]
    fig = make_subplots(rows=len(titles), cols=1, subplot_titles=titles)
    tenants = sorted({r["tenant"] for r in rows} | {r["tenant"] for r in topics})
    for i, (_, columns) in enumerate(CHARTS, start=1):
        for t in tenants:
            mine = [r for r in rows if r["tenant"] == t]
            for c in columns:
                fig.add_trace(
                    go.Bar(
                        x=[r["hour"] for r in mine],
                        y=[r[c] for r in mine],
                        name=t if len(columns) == 1 else f"{t} {c}",
                        legendgroup=t,
                        showlegend=len(columns) > 1 or i == 1,
                    ),
                    row=i,
                    col=1,
                )
    for t in tenants:
        mine = [r for r in topics if r["tenant"] == t]
        fig.add_trace(
            go.Bar(
                x=[r["topic"] for r in mine],
                y=[r["messages"] for r in mine],
                name=f"{t} topics",
                legendgroup=t,
            ),
            row=len(titles),
            col=1,
        )
    fig.update_layout(
        title="Starling tenant usage per hour (UTC)", barmode="group", height=300 * len(titles)
    )
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def run(ctx: JobContext, args: argparse.Namespace) -> dict[str, Any]:
    df = hourly(ctx, args)
    parquet = ctx.output_dir / "usage.parquet"
    df.write.mode("overwrite").partitionBy("tenant").parquet(str(parquet))
    rows = [r.asDict() for r in df.collect()]  # one row per tenant and hour: small
    top = top_topics(ctx, args)
    top_parquet = ctx.output_dir / "top_topics.parquet"
    top.write.mode("overwrite").parquet(str(top_parquet))
    topics = [r.asDict() for r in top.collect()]  # at most TOP_TOPICS per tenant
    html = ctx.output_dir / "report.html"
    write_html(rows, topics, html)
    totals: dict[str, dict[str, Any]] = {}
    for r in rows:
        t = totals.setdefault(r["tenant"], dict.fromkeys(FIGURES, 0))
        for k in FIGURES:
            t[k] += r[k] or 0
    for r in topics:
        t = totals.setdefault(r["tenant"], dict.fromkeys(FIGURES, 0))
        t.setdefault("top_topics", []).append((r["topic"], r["messages"]))
    return {
        "parquet": str(parquet),
        "top_topics": str(top_parquet),
        "html": str(html),
        "hours": len(rows),
        "totals": totals,
    }
