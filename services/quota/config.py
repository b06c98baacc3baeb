"""Settings of the quota service (env `STARLING_*`, TOML table `[quota]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class QuotaSettings(ServiceSettings):
    service_name: ClassVar[str] = "quota"
    grpc_port: int = Field(default=7005, ge=0, le=65535, description="gRPC port; 0 picks one.")
    lease_ttl_ms: int = Field(default=1000, gt=0, le=60_000)
