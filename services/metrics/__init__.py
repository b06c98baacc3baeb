"""Metrics service: owns cluster and tenant statistics built from node reports, and the stats
admin API. Nodes call `ReportNodeStats` periodically; `GetClusterStats` sums the latest report
of every live node (a node silent for `node_stale_s` no longer counts). `$SYS` topics and
OTLP export of cluster series arrive with later issues; every process already exports its own
metrics on its Prometheus endpoint.
"""
