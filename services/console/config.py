"""Settings of the web console (env `STARLING_*`, TOML table `[console]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from services.common.config import ServiceSettings
from services.common.forwarded import TrustedProxies


class ConsoleSettings(ServiceSettings):
    service_name: ClassVar[str] = "console"
    grpc_port: int = Field(
        default=7020, ge=0, le=65535, description="gRPC port (health only); 0 picks one."
    )
    console_host: str = Field(
        default="127.0.0.1",
        description="Address the console's HTTP server binds; `0.0.0.0` in a container.",
    )
    console_port: int = Field(
        default=8080, ge=0, le=65535, description="The console's HTTP port; 0 picks one."
    )
    rules_addr: str = Field(default="127.0.0.1:7004", description="Rules service gRPC.")
    console_session_ttl_s: int = Field(
        default=3600,
        ge=60,
        le=7 * 86400,
        description="How long a sign-in lasts (the cookie's Max-Age and the session's life in "
        "Redis); a tenant token's own expiry ends it sooner.",
    )
    console_sign_in_attempts_per_minute: int = Field(
        default=10,
        ge=1,
        le=10_000,
        description="Sign-in attempts one client address may make per minute, across every "
        "console instance (counted in Redis); more are refused with 429.",
    )
    console_cookie_secure: bool = Field(
        default=False,
        description="Mark the session cookie Secure (sent over HTTPS only): set it when the "
        "console is served through a TLS-terminating proxy.",
    )
    console_trusted_proxies: list[str] = Field(
        default_factory=list,
        description="CIDRs of proxies whose X-Forwarded-For / Forwarded headers name the "
        "client address (the address sign-in limits and the audit log use).",
    )
    console_page_size: int = Field(
        default=50, ge=5, le=1000, description="Rows per page of the console's lists."
    )

    console_sample_interval_s: float = Field(
        default=10.0,
        ge=0.2,
        le=300.0,
        description="How often the overview's charts take a sample (one console replica takes "
        "each, kept in Redis).",
    )
    console_history_s: int = Field(
        default=3600,
        ge=60,
        le=86400,
        description="How far back the overview's charts go (samples older are dropped).",
    )
    console_mesh_file: str = Field(
        default="",
        description="A local mesh's mesh.json (set by `starling up`): where the console finds "
        "every instance to watch and every node to drain. Empty: the instances of the *_addr "
        "settings and `console_nodes`.",
    )
    console_nodes: list[str] = Field(
        default_factory=list,
        description="Connection nodes' admin gRPC addresses as `name=host:port` (outside a "
        "local mesh), for the overview and the operations page.",
    )

    @field_validator("console_nodes")
    @classmethod
    def _nodes_parse(cls, value: list[str]) -> list[str]:
        for entry in value:
            name, sep, addr = entry.partition("=")
            if not sep or not name.strip() or ":" not in addr:
                raise ValueError(f"{entry!r}: expected name=host:port")
        return value

    @field_validator("console_trusted_proxies")
    @classmethod
    def _proxies_parse(cls, value: list[str]) -> list[str]:
        TrustedProxies.parse(value)
        return value
