"""Settings of the metrics service (env `STARLING_*`, TOML table `[metrics]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class MetricsSettings(ServiceSettings):
    service_name: ClassVar[str] = "metrics"
    grpc_port: int = Field(default=7006, ge=0, le=65535, description="gRPC port; 0 picks one.")
    node_stale_s: float = Field(default=30.0, gt=0, description="Forget silent nodes after this.")
    cluster_metrics_port: int = Field(
        default=9470,
        ge=-1,
        le=65535,
        description="Port of the cluster's Prometheus endpoint (per-tenant series summed over "
        "every live reporter, docs/metrics.md), bound on `metrics_host`; 0 picks one, -1 "
        "disables. The process's own series stay on `metrics_port`.",
    )
    sys_interval_s: float = Field(
        default=10.0,
        ge=0,
        description="How often each tenant's `$SYS/broker/...` topics are refreshed "
        "(retained, only values that changed; docs/metrics.md); 0 publishes none. Only the "
        "instance with `instance_index` 0 publishes.",
    )
    sys_operator_tenant: str = Field(
        default="",
        description="The tenant whose `$SYS` topics show the whole cluster's figures "
        "instead of its own; empty: none.",
    )
