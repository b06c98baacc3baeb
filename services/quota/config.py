"""Settings of the quota service (env `STARLING_*`, TOML table `[quota]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class QuotaSettings(ServiceSettings):
    service_name: ClassVar[str] = "quota"
    grpc_port: int = Field(default=7005, ge=0, le=65535, description="gRPC port; 0 picks one.")
    lease_ttl_ms: int = Field(
        default=1000,
        gt=0,
        le=60_000,
        description="How long a lease of a total (connections, sessions) is good for; rate "
        "leases are good until the end of their one-second window.",
    )
    share_horizon_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="A node counts in a rate budget's fair share for this long after it last "
        "asked for the budget: each lease tells the node how many nodes asked within it, and "
        "a node that cannot reach the quota service grants itself at most the limit divided "
        "by that many (quota_unavailable=keep). Longer: a node that paused still counts "
        "(shares are smaller, the sum stays within the limit); shorter: a node gone quiet "
        "stops shrinking the others' shares sooner.",
    )
    max_bans: int = Field(
        default=100_000,
        ge=1,
        description="Bans in force at once (operator and automatic); one more is refused "
        "with RESOURCE_EXHAUSTED. Every node and session service holds the whole list.",
    )
