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
    cassandra_contact_points: list[str] = Field(
        default_factory=list, description="Empty: the embedded SQLite store under data_dir."
    )
    cassandra_port: int = Field(default=9042, ge=1, le=65535)
    cassandra_keyspace: str = Field(default="starling", pattern=r"^[a-z_][a-z0-9_]*$")
    cassandra_consistency: str = Field(default="LOCAL_QUORUM")
