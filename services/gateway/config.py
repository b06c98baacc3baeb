"""Settings of the gateway service (env `STARLING_*`, TOML table `[gateway]`): where its HTTP
and CoAP listeners bind, and every bound a client can make it hold, each with its default."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from services.common.config import ServiceSettings, existing_file
from services.common.forwarded import TrustedProxies


class GatewaySettings(ServiceSettings):
    service_name: ClassVar[str] = "gateway"
    grpc_port: int = Field(
        default=7030, ge=0, le=65535, description="gRPC port (health only); 0 picks one."
    )
    gateway_host: str = Field(
        default="127.0.0.1",
        description="Address the HTTP and CoAP listeners bind; `0.0.0.0` in a container.",
    )
    gateway_http_port: int = Field(
        default=8090,
        ge=-1,
        le=65535,
        description="Port of the HTTP publish API (plain HTTP); 0 picks one, -1 disables.",
    )
    gateway_https_port: int = Field(
        default=-1,
        ge=-1,
        le=65535,
        description="Port of the HTTP publish API over TLS (needs tls_cert_file and "
        "tls_key_file, as a node's TLS listener); 0 picks one, -1 (the default) disables.",
    )
    tls_cert_file: Path | None = Field(default=None, description="PEM server certificate.")
    tls_key_file: Path | None = Field(default=None, description="PEM private key.")
    gateway_coap_port: int = Field(
        default=5683,
        ge=-1,
        le=65535,
        description="UDP port of the CoAP gateway (RFC 7252); 0 picks one, -1 disables.",
    )
    gateway_trusted_proxies: list[str] = Field(
        default_factory=list,
        description="CIDRs of proxies whose X-Forwarded-For / Forwarded headers name the HTTP "
        "client's address (the address the per-address request rate counts).",
    )
    gateway_http_max_body_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        le=64 << 20,
        description="Largest HTTP request body; larger is refused with 413 before it is read.",
    )
    gateway_http_max_bulk: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Most messages in one `POST /api/v5/publish/bulk`; more: 400.",
    )
    gateway_requests_per_ip_per_s: int = Field(
        default=1000,
        ge=0,
        description="HTTP requests one client address may make per second (a bulk request "
        "counts once); more are answered 429 with Retry-After. 0: no cap (the development "
        "profile, where every client is 127.0.0.1).",
    )
    gateway_coap_messages_per_ip_per_s: int = Field(
        default=100,
        ge=0,
        description="CoAP requests one client address may make per second; more are "
        "answered 4.29 Too Many Requests with Max-Age. 0: no cap (development profile).",
    )
    gateway_max_payload_bytes: int = Field(
        default=256 << 10,
        ge=16,
        le=512 << 10,
        description="Largest message payload the gateway publishes (HTTP after base64 "
        "decoding, CoAP); larger: 400 / 4.13. At most 512 KiB: each message goes on NATS "
        "whole, under any server's max_payload (NATS's default is 1 MiB).",
    )
    gateway_coap_max_observations: int = Field(
        default=10_000,
        ge=1,
        description="CoAP observations the gateway holds at once, every client together; "
        "more: 5.03 Service Unavailable.",
    )
    gateway_coap_observations_per_client: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Observations one CoAP client (client id) may hold; more: 4.29.",
    )
    gateway_coap_clients: int = Field(
        default=10_000,
        ge=1,
        description="CoAP clients (client ids) registered at once; more: 5.03.",
    )
    gateway_coap_client_idle_s: float = Field(
        default=300.0,
        ge=5,
        le=86_400,
        description="A CoAP client with no request and no observation for this long is "
        "unregistered (it disappears from `starling clients`).",
    )
    gateway_auth_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long a Basic-auth login (MQTT user name and password, with its ACL) "
        "is trusted before the session service is asked again; 0: every request asks.",
    )
    gateway_auth_cache_entries: int = Field(
        default=10_000, ge=1, description="Logins remembered at most (oldest dropped first)."
    )
    gateway_quota_recheck_s: float = Field(
        default=5.0,
        ge=0.1,
        le=300,
        description="How long an unlimited tenant's rate stays unasked (a limit set meanwhile "
        "is also announced on ctl.quota.limits, which drops it at once).",
    )
    gateway_publish_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="How long one publish may wait for the router to keep it; longer: 503.",
    )
    gateway_mesh_interest_wait_s: float = Field(
        default=2.2,
        ge=0,
        le=10,
        description="After announcing interest in a tenant (its first CoAP observation), how "
        "long the gateway waits at most for every node to confirm before it confirms the "
        "observation: the nodes' mesh_interest_window_s times 1.1 "
        "(services/connection/interest.py).",
    )

    _files = field_validator("tls_cert_file", "tls_key_file")(existing_file)

    @field_validator("gateway_trusted_proxies")
    @classmethod
    def _proxies_parse(cls, value: list[str]) -> list[str]:
        TrustedProxies.parse(value)
        return value

    @model_validator(mode="after")
    def _tls_needs_files(self) -> GatewaySettings:
        if self.gateway_https_port >= 0 and not (self.tls_cert_file and self.tls_key_file):
            raise ValueError("gateway_https_port needs tls_cert_file and tls_key_file")
        return self
