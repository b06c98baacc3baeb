"""The Grafana dashboard in deploy/grafana/ is importable (valid JSON, panels with queries)
and charts only series Starling exports: every metric an expression names is one the
cluster endpoint (services/metrics/exporter.py) or the RED metrics (services/common/rpc/
red.py) produce."""

from __future__ import annotations

import json
import re
from pathlib import Path

from services.metrics.exporter import series_names

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "starling-cluster.json"
RED = {
    "starling_rpc_requests_total",
    "starling_rpc_errors_total",
    *(f"starling_rpc_duration_seconds_{s}" for s in ("bucket", "sum", "count")),
}
# PromQL words that look like metric names: functions, aggregations, keywords
_PROMQL = {"sum", "by", "rate", "histogram_quantile", "label_values", "le", "tenant"}


def test_every_expression_names_an_exported_series() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["panels"]
    exported = set(series_names()) | RED
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    assert len(exprs) >= 14
    named = set()
    for e in exprs:
        bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\([^()]*?\)(?=\s*\()", " ", e)
        named |= {
            w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if w.startswith("starling")
        }
    assert named and named <= exported, named - exported
    series = {n for n in exported if any(n in e for e in exprs)}
    assert {"starling_cluster_messages_received_total", "starling_rpc_errors_total"} <= series
