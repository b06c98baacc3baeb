"""Settings shared by every service: pydantic-settings over `STARLING_*` env vars and TOML.

Sources, highest priority first: explicit arguments, environment (`STARLING_<FIELD>`), secret
files in the folder named by `STARLING_SECRETS_DIR` (one file per setting, named
`starling_<field>`, as Docker and Kubernetes mount secrets), the TOML file named by
`STARLING_CONFIG` (tables `[common]` then `[<service>]`), defaults. Each tunable is
typed, defaulted and validated with its unit in its name. `load_settings` turns a validation
error into `ConfigError` whose message names the setting and its env variable.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from services.common.redact import redact_url, url_passwords
from services.common.redis_settings import RedisSettings
from services.common.rpc import limits as rpc_limits
from services.common.store.cassandra_schema import parse_replication

ENV_PREFIX = "STARLING_"


class ConfigError(Exception):
    """A setting is invalid; the message names it."""


class _TomlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], section: str) -> None:
        super().__init__(settings_cls)
        self._data: dict[str, Any] = {}
        path = os.environ.get(ENV_PREFIX + "CONFIG")
        if path:
            try:
                doc = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"STARLING_CONFIG={path}: cannot read TOML: {exc}") from exc
            own = doc.get(section, {})
            # A key of the service's own section that it has no setting for is a typo
            # (`acl_defualt`): ignoring it would run with the default. (`common` is shared by
            # every service, so a key there may be another service's.)
            unknown = sorted(set(own) - set(settings_cls.model_fields))
            if unknown:
                raise ConfigError(
                    f"STARLING_CONFIG={path}: [{section}] has no setting "
                    + ", ".join(repr(k) for k in unknown)
                    + " (docs/configuration.md lists them)"
                )
            self._data = {**doc.get("common", {}), **own}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        names = set(self.settings_cls.model_fields)
        return {k: v for k, v in self._data.items() if k in names}


class ServiceSettings(RedisSettings):
    """Fields every service has (the Redis ones in services/common/redis_settings.py).
    Subclasses set `service_name`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")
    service_name: ClassVar[str] = "service"

    node_id: str = Field(
        default="",
        description="Instance name; defaults to <service>-<host>-<pid>. Give each "
        "connection node a stable one (a restarted node releases its earlier life's sessions).",
    )
    instance_index: int = Field(
        default=0,
        ge=0,
        description="This instance's ordinal among the instances of its service (0 ..."
        " instance_count - 1; a StatefulSet pod's ordinal); `starling up` sets it.",
    )
    instance_count: int = Field(
        default=1,
        ge=1,
        description="Instances of this service in the cluster. Above 1, a router shares its "
        'state through Redis and the store (docs/architecture.md, "Several instances").',
    )
    grpc_host: str = Field(default="127.0.0.1", description="Address the gRPC server binds.")
    grpc_port: int = Field(default=0, ge=0, le=65535, description="gRPC port; 0 picks one.")
    metrics_port: int = Field(
        default=0, ge=-1, le=65535, description="Prometheus port; 0 picks one, -1 disables."
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="Address the Prometheus endpoint binds; `0.0.0.0` to be scraped from "
        "outside the host or pod (containers, Kubernetes).",
    )
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URL, or several comma-separated (the servers of a cluster; "
        "the others are learnt from the first one reached). Credentials in it are accepted, "
        "and redacted in logs.",
    )
    nats_stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the JetStream streams Starling creates (EVENTS, RULES): 1 "
        "for a single NATS server, 3 on a cluster of three or more, so that one server may "
        "die without a stream losing its quorum (`starling up --nats 3` sets 3).",
    )
    nats_user: str = Field(default="", description="NATS user of this service; empty: none.")
    nats_password: SecretStr = Field(default=SecretStr(""), description="NATS password.")
    dependency_wait_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="At start-up, how long the process waits for NATS, JetStream and Redis to "
        "answer "
        "(retrying with backoff, NOT_SERVING meanwhile) before it exits with an error "
        "(docs/failure-behaviour.md).",
    )
    data_dir: Path = Field(default=Path(".starling/data"), description="Embedded store folder.")
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    log_file: Path | None = Field(default=None, description="Also log JSON lines here.")
    otlp_endpoint: str = Field(default="", description="OTLP gRPC endpoint; empty: no export.")
    trace_sample_ratio: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of PUBLISHes (and CONNECTs) traced, for tenants not in "
        "`trace_sample_tenants`; 0: none.",
    )
    trace_sample_tenants: dict[str, float] = Field(
        default_factory=dict,
        description="Per-tenant trace share overriding `trace_sample_ratio`, e.g. "
        '`{"acme": 1.0}` traces every message of tenant acme and no other.',
    )
    trace_file_dir: Path | None = Field(
        default=None,
        description="Also write every finished span as one JSON line to "
        "`<dir>/<node_id>.jsonl` (the local mesh's exporter; `starling up` sets "
        "`<data dir>/traces`); unset: no file.",
    )
    admin_auth: Literal["token", "disabled"] = Field(
        default="token",
        description="`token`: admin RPCs need the operator token or a tenant token; "
        "`disabled`: anyone who reaches an admin API may use it (a local mesh only).",
    )
    admin_token: SecretStr = Field(
        default=SecretStr(""),
        description="Operator bearer token for admin RPCs (every tenant); required when "
        "admin_auth is `token`.",
    )
    admin_token_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long a service trusts the session service's answer about a tenant "
        "token; a revoked token may work this long on services other than session.",
    )
    mesh_auth: Literal["secret", "disabled"] = Field(
        default="secret",
        description="`secret`: internal gRPC calls must carry mesh_secret; `disabled`: no "
        "check (a local mesh only).",
    )
    mesh_secret: SecretStr = Field(
        default=SecretStr(""),
        description="Shared secret of the mesh, sent as call metadata on internal gRPC calls; "
        "required when mesh_auth is `secret`.",
    )
    shutdown_grace_s: float = Field(default=5.0, gt=0, le=300)
    max_packet_size_bytes: int = Field(
        default=rpc_limits.DEFAULT_MAX_PACKET_SIZE_BYTES,
        ge=64,
        le=268_435_460,
        description="Largest MQTT packet accepted after CONNACK (fixed header included); "
        "larger: DISCONNECT 0x95. Also the largest WebSocket message (close 1009). Every "
        "service sizes its gRPC message limits from it (plus 1 MiB of envelope), so set it "
        "for the whole mesh (env or the TOML `[common]` table), not for one service.",
    )
    cassandra_contact_points: list[str] = Field(
        default_factory=list, description="Empty: the embedded SQLite store under data_dir."
    )
    store_sync: Literal["full", "normal"] = Field(
        default="full",
        description="Embedded store durability of a commit (and so of every PUBACK/PUBREC "
        "for a persistent session): `full` fsyncs each group commit (survives a killed "
        "process and a power cut); `normal` leaves the fsync to WAL checkpoints (survives a "
        "killed process, a power cut or OS crash can lose the last commits; lower latency "
        "on slow disks). docs/failure-behaviour.md.",
    )
    cassandra_port: int = Field(default=9042, ge=1, le=65535)
    cassandra_keyspace: str = Field(default="starling", pattern=r"^[a-z_][a-z0-9_]*$")
    cassandra_consistency: str = Field(
        default="LOCAL_QUORUM",
        pattern="^(ONE|TWO|THREE|QUORUM|LOCAL_QUORUM|EACH_QUORUM|ALL|LOCAL_ONE)$",
        description="Consistency of every Cassandra read and write (docs/storage.md); below "
        "a quorum an acknowledged message can be lost with one replica.",
    )
    cassandra_serial_consistency: Literal["LOCAL_SERIAL", "SERIAL"] = Field(
        default="LOCAL_SERIAL",
        description="Paxos phase of Cassandra lightweight transactions (queue counters, "
        "partition and schema fencing, session records); SERIAL fences across data centres.",
    )
    cassandra_replication: str = Field(
        default="SimpleStrategy:1",
        description="Replication of a keyspace Starling creates: 'SimpleStrategy:N' "
        "(development) or 'dc1:3,dc2:3' (NetworkTopologyStrategy, replicas per data centre). "
        "An existing keyspace is not altered (a warning says it differs).",
    )
    queue_store_by_tenant: dict[str, Literal["store", "redis"]] = Field(
        default_factory=dict,
        description='Queue backend per tenant, JSON `{"tenant": "redis"}`: `store` (SQLite or '
        "Cassandra, above) or `redis` (Redis Streams: faster, as durable as that Redis is "
        'configured; docs/storage.md, "Redis Streams queues"); others: `queue_store_default`. '
        "Move a tenant only once its queues are drained (else the queue service will not start).",
    )
    queue_store_default: Literal["store", "redis"] = Field(
        default="store", description="Queue backend of tenants not in queue_store_by_tenant."
    )
    queue_redis_url: str = Field(
        default="",
        description="One Redis server for the Redis Streams queues; empty: the service's Redis "
        "(`redis_mode`, ...). Set, it is also checked for tenants moved off it.",
    )
    queue_redis_key_prefix: str = Field(
        default="st:q:", min_length=1, description="Prefix of the Redis Streams queues' keys."
    )
    queue_redis_max_connections: int = Field(
        default=64, ge=1, le=10_000, description="Pool of the Redis Streams queues (per node)."
    )
    session_addr: str = Field(default="127.0.0.1:7001", description="Session service gRPC.")
    session_subject: str = Field(
        default="svc.session",
        pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        description="NATS subject prefix of the nodes' CONNECTs and disconnects to the "
        "session service (`<prefix>.connect`, `<prefix>.disconnect`, request/reply): nodes "
        "and session services of one mesh must agree, and the NATS permissions of `starling "
        "secrets` name the default; another prefix keeps two meshes apart on one NATS.",
    )
    router_addr: str = Field(default="127.0.0.1:7002", description="Router service gRPC.")
    queue_addr: str = Field(default="127.0.0.1:7003", description="Queue service gRPC.")
    quota_addr: str = Field(default="127.0.0.1:7005", description="Quota service gRPC.")
    metrics_addr: str = Field(default="127.0.0.1:7006", description="Metrics service gRPC.")
    stats_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often a connection node (its counters) and the session, router and "
        "queue services (the state they hold per tenant) report to the metrics service.",
    )

    @field_validator("trace_sample_tenants")
    @classmethod
    def _tenant_ratios_are_shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(t for t, r in value.items() if not 0.0 <= r <= 1.0)
        if bad:
            raise ValueError(f"ratios must be between 0 and 1 (tenants {', '.join(bad)})")
        return value

    @property
    def tracing(self) -> bool:
        """Whether any message may be traced (else no span is even started)."""
        return self.trace_sample_ratio > 0 or any(self.trace_sample_tenants.values())

    @field_validator("cassandra_replication")
    @classmethod
    def _replication_parses(cls, value: str) -> str:
        parse_replication(value)  # ValueError names what is wrong; pydantic names the setting
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = _TomlSource(settings_cls, getattr(settings_cls, "service_name", "service"))
        folder = os.environ.get(ENV_PREFIX + "SECRETS_DIR")
        if not folder:
            return (init_settings, env_settings, toml)
        if not Path(folder).is_dir():
            raise ConfigError(f"STARLING_SECRETS_DIR={folder}: not a folder")
        files = SecretsSettingsSource(settings_cls, secrets_dir=folder)
        return (init_settings, env_settings, files, toml)

    def redacted(self) -> dict[str, Any]:
        """Effective config for the start-up log; secrets shown as '***'."""
        out: dict[str, Any] = {}
        for name, value in self:
            if isinstance(value, SecretStr):
                out[name] = "***" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                out[name] = str(value)
            elif isinstance(value, str) and name in _NOT_SECRET:
                out[name] = value
            elif _is_secret(name):
                out[name] = "***"
            elif isinstance(value, str):
                out[name] = redact_url(value)
            else:
                out[name] = value
        return out

    def nats_options(self) -> dict[str, Any]:
        """`user`/`password`/`wait_s` keyword arguments of services.common.bus.client.connect."""
        return {
            "user": self.nats_user,
            "password": self.nats_password.get_secret_value(),
            "wait_s": self.dependency_wait_s,
        }

    def secret_values(self) -> list[str]:
        """Every secret this process holds (for the log scrubber): SecretStr fields and
        passwords inside URLs."""
        found = [v.get_secret_value() for _, v in self if isinstance(v, SecretStr)]
        found += [p for _, v in self if isinstance(v, str) for p in url_passwords(v)]
        return [v for v in found if v]

    def check_credentials(self) -> None:
        """Start-up check: auth that is on must have its secret (a bad config names the
        setting instead of running with an open door)."""
        if self.admin_auth == "token" and not self.admin_token.get_secret_value():
            raise ConfigError(
                "invalid setting admin_token (STARLING_ADMIN_TOKEN): required while admin_auth "
                "is 'token' (set a long random token, or admin_auth=disabled for a local mesh)"
            )
        if self.mesh_auth == "secret" and not self.mesh_secret.get_secret_value():
            raise ConfigError(
                "invalid setting mesh_secret (STARLING_MESH_SECRET): required while mesh_auth "
                "is 'secret' (the same random value on every service of the mesh, or "
                "mesh_auth=disabled for a local mesh)"
            )


# Settings whose names contain "token"/"secret" but hold no secret.
_NOT_SECRET = {"admin_auth", "mesh_auth"}


def _is_secret(name: str) -> bool:
    return name not in _NOT_SECRET and any(w in name for w in ("password", "token", "secret"))


def existing_file(path: Path | None) -> Path | None:
    """A field validator for files read at start (certificates, keys): a missing one stops
    start-up naming the setting, not later with a bare "No such file". Empty: none."""
    if path is not None and str(path) in ("", "."):
        return None
    if path is not None and not path.is_file():
        raise ValueError(f"no such file: {path}")
    return path


S = TypeVar("S", bound=ServiceSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build and validate `cls`; raise `ConfigError` naming the first bad setting."""
    try:
        settings = cls(**overrides)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            if not err["loc"]:
                # A rule between settings (its message names them); its input is every
                # setting at once, secrets included: never shown.
                lines.append(f"invalid settings: {err['msg']}")
                continue
            name = ".".join(str(p) for p in err["loc"])
            env = ENV_PREFIX + str(err["loc"][0]).upper()
            got = "***" if _is_secret(str(err["loc"][0])) else repr(err.get("input"))
            lines.append(f"invalid setting {name} ({env}): {err['msg']} (got {got})")
        raise ConfigError("; ".join(lines)) from None
    except SettingsError as exc:
        # A list or mapping setting whose value does not parse (it takes JSON).
        found = re.search(r'field "([^"]+)"', str(exc))
        name = found.group(1) if found else "?"
        raise ConfigError(
            f"invalid setting {name} ({ENV_PREFIX}{name.upper()}): not valid JSON for a list "
            'or mapping (for example ["a", "b"] or {"a": "b"}): ' + str(exc.__cause__ or exc)
        ) from None
    settings.check_credentials()
    # The process's gRPC channels and servers are sized from the mesh's largest packet.
    rpc_limits.configure(settings.max_packet_size_bytes)
    if not settings.node_id:
        # The host too: in containers every process is pid 1.
        settings.node_id = f"{cls.service_name}-{socket.gethostname()}-{os.getpid()}"
    return settings
