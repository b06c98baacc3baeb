"""The Redis settings every service has: which Redis deployment it talks to (one server, a
Sentinel-managed primary, or a Redis Cluster), where, and with which credentials.

`ServiceSettings` (services/common/config.py) inherits them; services/common/redis_client.py
turns them into the one client a process uses. The rule between them (a mode names what it
needs) is checked at start, so an inconsistent deployment stops with a message naming the
setting instead of running against the wrong Redis.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings


def parse_address(entry: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) as (host, port); ValueError names a bad one."""
    host, sep, port = entry.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} is not host:port")
    return host.strip("[]"), int(port)


class RedisSettings(BaseSettings):
    """Fields of `ServiceSettings` that say how to reach Redis."""

    redis_mode: Literal["standalone", "sentinel", "cluster"] = Field(
        default="standalone",
        description="`standalone`: one redis-server at `redis_url`; `sentinel`: the primary "
        "that the Sentinels in `redis_sentinels` name `redis_master_name` (followed across "
        "a failover without a restart); `cluster`: a Redis Cluster reached through "
        '`redis_cluster_nodes` (docs/operations.md, "Redis").',
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis URL (a password in it is accepted, and redacted in logs). With "
        "`redis_mode` sentinel or cluster only its credentials, database and TLS (rediss://) "
        "are used.",
    )
    redis_password: SecretStr = Field(
        default=SecretStr(""), description="Redis password (`requirepass`); empty: the URL's."
    )
    redis_sentinels: list[str] = Field(
        default_factory=list,
        description='Sentinel addresses, `["host:port", ...]`; required with `redis_mode` '
        "sentinel (any of them is asked for the primary; give all of them).",
    )
    redis_master_name: str = Field(
        default="starling",
        min_length=1,
        description="The name the Sentinels monitor the primary under (`sentinel monitor "
        "<name> ...`).",
    )
    redis_sentinel_password: SecretStr = Field(
        default=SecretStr(""),
        description="Password of the Sentinels themselves (their `requirepass`); empty: the "
        "Sentinels need none.",
    )
    redis_cluster_nodes: list[str] = Field(
        default_factory=list,
        description='Seed nodes of a Redis Cluster, `["host:port", ...]`; required with '
        "`redis_mode` cluster (the rest of the cluster is learnt from them).",
    )
    redis_failover_wait_s: float = Field(
        default=15.0,
        ge=0,
        le=300,
        description="With `redis_mode` sentinel or cluster: how long a Redis command is "
        "retried with backoff (0.05 s doubling to 0.5 s) while the primary is unreachable or "
        "read-only (a failover under way) before it fails.",
    )

    @field_validator("redis_sentinels", "redis_cluster_nodes")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_address(entry)
        return value

    @model_validator(mode="after")
    def _mode_has_what_it_needs(self) -> RedisSettings:
        mode = self.redis_mode
        if mode == "sentinel" and not self.redis_sentinels:
            raise ValueError(
                "redis_sentinels (STARLING_REDIS_SENTINELS) is required while redis_mode is "
                "'sentinel'"
            )
        if mode == "cluster" and not self.redis_cluster_nodes:
            raise ValueError(
                "redis_cluster_nodes (STARLING_REDIS_CLUSTER_NODES) is required while "
                "redis_mode is 'cluster'"
            )
        if mode != "sentinel" and self.redis_sentinels:
            raise ValueError(
                f"redis_sentinels (STARLING_REDIS_SENTINELS) is set but redis_mode is "
                f"{mode!r}: set redis_mode=sentinel, or leave redis_sentinels empty"
            )
        if mode != "cluster" and self.redis_cluster_nodes:
            raise ValueError(
                f"redis_cluster_nodes (STARLING_REDIS_CLUSTER_NODES) is set but redis_mode is "
                f"{mode!r}: set redis_mode=cluster, or leave redis_cluster_nodes empty"
            )
        return self
