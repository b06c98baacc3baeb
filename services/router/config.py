"""Settings of the router service (env `STARLING_*`, TOML table `[router]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings
from services.router.limits import Caps


class RouterSettings(ServiceSettings):
    service_name: ClassVar[str] = "router"
    grpc_port: int = Field(default=7002, ge=0, le=65535, description="gRPC port; 0 picks one.")
    max_retained_per_tenant: int = Field(
        default=1_000_000,
        ge=0,
        description="Retained messages per tenant; more are refused (PUBACK 0x97); 0: no cap.",
    )
    max_retained_bytes_per_tenant: int = Field(
        default=256 << 20,
        ge=0,
        description="Bytes (serialized size) of a tenant's retained messages; more are "
        "refused (PUBACK 0x97); 0: no cap.",
    )
    quota_enabled: bool = Field(
        default=True,
        description="Enforce tenants' `max_retained_messages`/`max_retained_bytes` "
        "(`starling quota set`; below the caps here): copies of the quota service's limits, "
        "refreshed on change (docs/quota.md).",
    )
    max_delayed_per_tenant: int = Field(
        default=100_000,
        ge=0,
        description="Pending `$delayed` messages per tenant; more are refused (PUBACK 0x97); "
        "0: no cap.",
    )
    max_delayed_bytes_per_tenant: int = Field(
        default=256 << 20,
        ge=0,
        description="Bytes (serialized size) of a tenant's pending `$delayed` messages; more "
        "are refused (PUBACK 0x97); 0: no cap.",
    )
    queue_qos0_offline: bool = Field(
        default=False, description="Also queue QoS 0 messages for persistent sessions."
    )

    def caps(self) -> Caps:
        return Caps(
            retained_messages=self.max_retained_per_tenant,
            retained_bytes=self.max_retained_bytes_per_tenant,
            delayed_messages=self.max_delayed_per_tenant,
            delayed_bytes=self.max_delayed_bytes_per_tenant,
        )
