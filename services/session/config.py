"""Settings of the session service (env `STARLING_*`, TOML table `[session]`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from services.common.config import ServiceSettings


class SessionSettings(ServiceSettings):
    service_name: ClassVar[str] = "session"
    grpc_port: int = Field(default=7001, ge=0, le=65535, description="gRPC port; 0 picks one.")

    anonymous_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants that accept clients without valid credentials; '*' for all.",
    )
    acl_default: Literal["allow", "deny"] = Field(
        default="allow", description="Decision when no ACL rule matches."
    )
    auth_cache_ttl_s: int = Field(default=300, ge=0, description="Redis cache of users/ACLs.")
    session_expiry_sweep_s: float = Field(default=1.0, gt=0, description="Expiry scan period.")
    node_timeout_s: float = Field(
        default=10.0, gt=0, description="A node silent this long is dead; its clients released."
    )
    max_session_expiry_s: int = Field(
        default=0xFFFFFFFF, ge=0, le=0xFFFFFFFF, description="Cap on Session Expiry Interval."
    )
    admin_token_max_ttl_s: int = Field(
        default=365 * 24 * 3600,
        ge=60,
        description="Longest lifetime of a tenant-scoped admin token.",
    )
    admin_tokens_per_tenant_max: int = Field(
        default=100, ge=1, le=100_000, description="Unexpired admin tokens one tenant may hold."
    )
