"""Metrics service: owns cluster and tenant statistics built from the reports of connection
nodes and of the session, router and queue services, the usage tables, the cluster
Prometheus endpoint (`cluster_metrics_port`, services/metrics/exporter.py) and the stats
admin API. Reporters call `ReportNodeStats` periodically; `GetClusterStats` sums the latest
report of every live reporter (one silent for `node_stale_s` no longer counts). It also
publishes every tenant's `$SYS/broker/...` topics (services/metrics/sys_publisher.py).
"""
