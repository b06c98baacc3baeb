"""Settings of the session service (env `STARLING_*`, TOML table `[session]`)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from services.common.config import ServiceSettings, existing_file
from services.common.connect import WILL_STORE_LIMIT_BYTES, WILL_STORE_MAX_BYTES


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
    event_log_batch_max: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="EVENTS-stream events the event-log recorder appends in one store write "
        "(docs/analytics.md).",
    )
    redis_max_connections: int = Field(
        default=100,
        ge=1,
        description="Redis connections the session service opens at most; commands beyond "
        "them wait for one (a reconnect storm's CONNECTs share pipelines, other commands "
        "queue here rather than fail).",
    )
    redis_pool_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a command waits for a free Redis connection before its "
        "CONNECT (or admin call) fails as unavailable.",
    )
    auth_local_cache_ttl_s: float = Field(
        default=60.0,
        ge=0,
        description="In-process copies of users' credentials and tenants' ACLs (no Redis "
        "round trip per CONNECT); every change drops them on every instance at once, this "
        "bounds how long a change announcement lost with NATS leaves one stale. 0: off.",
    )
    auth_local_cache_entries: int = Field(
        default=100_000,
        ge=1,
        description="Users and ACLs held in-process (and verified passwords remembered); "
        "past it the copies are dropped and read again.",
    )
    session_expiry_sweep_s: float = Field(default=1.0, gt=0, description="Expiry scan period.")
    node_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A node silent this long is dead; its clients released and the wills "
        "their entries kept published.",
    )
    will_store_max_bytes: int = Field(
        default=WILL_STORE_MAX_BYTES,
        ge=0,
        le=WILL_STORE_LIMIT_BYTES,
        description="Largest will (its envelope: topic, payload, properties) kept in the "
        "registry with its connection, so that it is published even if the node dies; a larger "
        "one only its node can publish. 0: none kept. Connection nodes have the same setting "
        "(they do not send a larger will); give both the same value.",
    )
    max_connections_per_tenant: int = Field(
        default=100_000,
        ge=0,
        description="Connected clients per tenant, mesh-wide; a CONNECT with a new client id "
        "beyond it gets CONNACK 0x97 (3.1.1: 3). 0: no cap.",
    )
    ban_sync_s: float = Field(
        default=10.0,
        gt=0,
        description="How often the ban list is re-read from the quota service (each change "
        "also comes at once over NATS); a lost announcement is late by at most this.",
    )
    flapping_enabled: bool = Field(
        default=True,
        description="Ban clients that connect too often (docs/quota.md): the same client id "
        "from the same address more than flapping_max_connects times in flapping_window_s, "
        "for flapping_ban_s. The refusal (CONNACK 0x8A Banned; 3.1.1: 5) and the "
        "`client_flapping` log line name these settings. The local mesh's development "
        "profile (`starling up`) sets false.",
    )
    flapping_max_connects: int = Field(
        default=15, ge=1, description="CONNECTs of one client id from one address per window."
    )
    flapping_max_connects_per_address: int = Field(
        default=0,
        ge=0,
        description="CONNECTs from one address per window, whatever the client id (catches "
        "clients that change their id); more: the address is banned. 0: off (behind NAT or "
        "a load balancer many clients share an address).",
    )
    flapping_window_s: float = Field(default=60.0, gt=0, description="Flapping window.")
    flapping_ban_s: int = Field(
        default=300, ge=1, description="How long a flapping client (or address) is banned."
    )
    shared_client_id_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants whose users may take over one another's client ids (sessions); "
        "'*' for all. Elsewhere a client id in use by another user gets CONNACK 0x87.",
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

    # ---- authentication (docs/security.md) -------------------------------------------
    auth_chain: dict[str, list[Literal["password", "scram", "jwt", "http", "cert"]]] = Field(
        default_factory=lambda: {"*": ["password", "scram"]},
        description=(
            "Authenticators per tenant, tried in order ('*': tenants not listed). 'scram' "
            "enables SCRAM-SHA-256/512 over MQTT 5 AUTH (its position does not matter)."
        ),
    )
    auth_max_concurrent_hashes: int = Field(
        default=4, ge=1, le=256, description="Password hash checks running at once."
    )
    auth_max_queued_hashes: int = Field(
        default=16,
        ge=0,
        description=(
            "Hash checks waiting beyond that; more: CONNACK 0x89. Keep the wait (queue x hash "
            "time / concurrency) well under the node's 5 s call deadline."
        ),
    )
    auth_failures_before_backoff_user: int = Field(
        default=5, ge=1, description="Failed logins of one user name before it is backed off."
    )
    auth_failures_before_backoff_ip: int = Field(
        default=20,
        ge=1,
        description="Failed logins from one IP address before it is backed off (every login "
        "from it, CONNACK 0x89, until the back-off ends). The local mesh's development "
        "profile sets 1000000 (its clients all come from 127.0.0.1).",
    )
    auth_backoff_base_s: float = Field(
        default=1.0, gt=0, description="First back-off; doubles with every further failure."
    )
    auth_backoff_max_s: float = Field(default=60.0, gt=0, description="Longest back-off.")
    auth_failure_window_s: float = Field(
        default=300.0, gt=0, description="Failures older than this (since the last) are forgotten."
    )
    auth_backoff_max_tracked: int = Field(
        default=100_000, ge=1, description="User names and addresses tracked; oldest dropped."
    )

    jwt_algorithms: list[Literal["HS256", "HS384", "HS512", "RS256", "ES256"]] = Field(
        default_factory=lambda: ["HS256", "RS256", "ES256"], description="Accepted JWT algorithms."
    )
    jwt_secret: SecretStr = Field(default=SecretStr(""), description="HMAC key (HS*).")
    jwt_public_key_file: Path | None = Field(
        default=None, description="PEM public key (RS256/ES256), or a JWKS JSON file."
    )
    jwt_jwks_url: str = Field(default="", description="JWKS URL (RS256/ES256 keys by kid).")
    jwt_jwks_cache_s: float = Field(default=300.0, ge=0, description="How long JWKS is kept.")
    jwt_audience: str = Field(default="", description="Required 'aud'; empty: not checked.")
    jwt_issuer: str = Field(default="", description="Required 'iss'; empty: not checked.")
    jwt_tenant_claim: str = Field(default="tenant", description="Claim naming the tenant.")
    jwt_username_claim: str = Field(default="sub", description="Claim naming the user.")
    jwt_acl_claim: str = Field(default="acl", description="Claim with ACL rules.")

    http_auth_url: str = Field(default="", description="HTTP auth service (POST JSON).")
    http_auth_timeout_s: float = Field(default=2.0, gt=0, le=60)
    http_auth_on_timeout: Literal["unavailable", "deny", "ignore"] = Field(
        default="unavailable",
        description="Service down or slow: 0x88, 0x87, or try the next authenticator.",
    )
    http_auth_cache_ttl_s: float = Field(default=60.0, ge=0, description="Answer cache; 0: off.")
    http_auth_cache_size: int = Field(default=10_000, ge=0)
    http_auth_max_concurrent: int = Field(
        default=32, ge=1, description="Requests to the HTTP auth service at once."
    )

    cert_identity: Literal["cn", "san_dns", "san_email", "san_uri"] = Field(
        default="cn", description="Where a client certificate's identity comes from."
    )

    _files = field_validator("jwt_public_key_file")(existing_file)

    @model_validator(mode="after")
    def _authenticators_configured(self) -> SessionSettings:
        used = {name for chain in self.auth_chain.values() for name in chain}
        if "jwt" in used and not (
            self.jwt_secret.get_secret_value() or self.jwt_public_key_file or self.jwt_jwks_url
        ):
            raise ValueError(
                "auth_chain uses 'jwt': set jwt_secret, jwt_public_key_file or jwt_jwks_url"
            )
        if "http" in used and not self.http_auth_url:
            raise ValueError("auth_chain uses 'http': set http_auth_url")
        if self.auth_backoff_max_s < self.auth_backoff_base_s:
            raise ValueError("auth_backoff_max_s must be at least auth_backoff_base_s")
        return self
