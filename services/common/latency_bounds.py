"""The publish-to-ack latency histogram's bounds, one figure for the mesh: connection nodes
count their QoS 1/2 acks into these buckets (services/connection/stats.py) and the metrics
service sums the buckets and exports them (services/metrics/core.py, exporter.py)."""

from __future__ import annotations

# Publish-to-PUBACK/PUBREC latency histogram bounds (seconds); the buckets of a report have
# one more entry, the +Inf bucket. Changing them breaks the sums of reports from nodes that
# run an older version: append only.
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
