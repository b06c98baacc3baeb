"""Settings of the router service (env `STARLING_*`, TOML table `[router]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class RouterSettings(ServiceSettings):
    service_name: ClassVar[str] = "router"
    grpc_port: int = Field(default=7002, ge=0, le=65535, description="gRPC port; 0 picks one.")
    max_retained_per_tenant: int = Field(
        default=1_000_000, ge=0, description="Retained messages per tenant; 0: no cap."
    )
    queue_qos0_offline: bool = Field(
        default=False, description="Also queue QoS 0 messages for persistent sessions."
    )
