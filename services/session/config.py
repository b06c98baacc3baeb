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
    max_connections_per_tenant: int = Field(
        default=100_000,
        ge=0,
        description="Connected clients per tenant, mesh-wide; a CONNECT with a new client id "
        "beyond it gets CONNACK 0x97 (3.1.1: 3). 0: no cap.",
    )
    shared_client_id_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants whose users may take over one another's client ids (sessions); "
        "'*' for all. Elsewhere a client id in use by another user gets CONNACK 0x87.",
    )
    max_session_expiry_s: int = Field(
        default=0xFFFFFFFF, ge=0, le=0xFFFFFFFF, description="Cap on Session Expiry Interval."
    )
