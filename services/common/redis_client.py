"""The one way a Starling process gets its Redis client, whatever the deployment.

`redis_client(settings, limits)` returns, for `redis_mode`:
- `standalone`: a client of the server at `redis_url`;
- `sentinel`: a client of the primary the Sentinels name (redis.asyncio.sentinel): each new
  connection asks a Sentinel where the primary is, a connection to a primary that died or
  was demoted (ReadOnlyError) is dropped, and a command that meets a failover is retried
  with backoff for `redis_failover_wait_s`, so the process follows a failover without a
  restart;
- `cluster`: a redis.asyncio.cluster.RedisCluster from `redis_cluster_nodes` (MOVED and ASK
  are followed by the library). Typed as `Redis`: the commands Starling sends have the same
  signatures on both, and the keys of one script share a slot (hash tags).

Each caller keeps its own pool limits (`PoolLimits`). `server_identity` says which server(s)
answer as primary right now, for the session service's check that notices a failover
(services/session/failover.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.common.redis_settings import RedisSettings, parse_address

BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 0.5
# What a failover (or a restart) makes a command raise: the retry covers these.
FAILOVER_ERRORS: list[type[Exception]] = [RedisConnectionError, RedisTimeoutError, ReadOnlyError]


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """A caller's pool: at most `max_connections` (None: redis-py's default); with
    `pool_timeout_s` a command waits that long for a free connection (a blocking pool)
    instead of failing at once; `retries`: extra attempts of a command that met a broken
    connection (None: the mode's default)."""

    max_connections: int | None = None
    pool_timeout_s: float | None = None
    retries: int | None = None


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A Sentinel-managed pool whose commands wait for a free connection."""


def failover_retries(wait_s: float) -> int:
    """Attempts of a backoff (BACKOFF_BASE_S doubling up to BACKOFF_CAP_S) that together
    wait about `wait_s`."""
    waited, attempts, step = 0.0, 0, BACKOFF_BASE_S
    while step < BACKOFF_CAP_S and waited < wait_s:
        waited, attempts, step = waited + step, attempts + 1, step * 2
    if waited < wait_s:
        attempts += math.ceil((wait_s - waited) / BACKOFF_CAP_S)
    return attempts


def _retry(retries: int) -> Retry:
    return Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), retries)


def _credentials(settings: RedisSettings) -> dict[str, Any]:
    """Username, password, database and TLS of `redis_url`, `redis_password` winning."""
    parsed = parse_url(settings.redis_url)
    out: dict[str, Any] = {
        "username": parsed.get("username"),
        "password": settings.redis_password.get_secret_value() or parsed.get("password"),
        "db": int(parsed.get("db") or 0),
    }
    if parsed.get("connection_class") is not None and "SSL" in str(parsed["connection_class"]):
        out["ssl"] = True
    return out


def redis_client(settings: RedisSettings, limits: PoolLimits | None = None) -> Redis:
    """The process's client for `settings.redis_mode` (see the module's docstring). Close
    it with `aclose()` (its pool goes with it)."""
    limits = limits or PoolLimits()
    if settings.redis_mode == "sentinel":
        return _sentinel_client(settings, limits)
    if settings.redis_mode == "cluster":
        return _cluster_client(settings, limits)
    return _standalone_client(settings, limits)


def _standalone_client(settings: RedisSettings, limits: PoolLimits) -> Redis:
    password = settings.redis_password.get_secret_value() or None
    options: dict[str, Any] = {"password": password}
    if limits.retries is not None:
        options["retry"] = _retry(limits.retries)
        options["retry_on_error"] = [RedisConnectionError, RedisTimeoutError]
    if limits.max_connections is not None:
        options["max_connections"] = limits.max_connections
    if limits.pool_timeout_s is None:
        return Redis.from_url(settings.redis_url, **options)
    pool = BlockingConnectionPool.from_url(
        settings.redis_url, timeout=limits.pool_timeout_s, **options
    )
    client = Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # aclose() closes the pool too
    return client


def _failover_options(settings: RedisSettings, limits: PoolLimits) -> dict[str, Any]:
    retries = failover_retries(settings.redis_failover_wait_s)
    return {
        "retry": _retry(max(retries, limits.retries or 0)),
        "retry_on_error": FAILOVER_ERRORS,
    }


def _sentinel_client(settings: RedisSettings, limits: PoolLimits) -> Redis:
    sentinel_password = settings.redis_sentinel_password.get_secret_value() or None
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        [parse_address(a) for a in settings.redis_sentinels],
        sentinel_kwargs={"password": sentinel_password, "socket_timeout": 2.0},
        **_credentials(settings),
    )
    options = _failover_options(settings, limits)
    if limits.max_connections is not None:
        options["max_connections"] = limits.max_connections
    pool_class: type[SentinelConnectionPool] = SentinelConnectionPool
    if limits.pool_timeout_s is not None:
        pool_class = _BlockingSentinelPool
        options["timeout"] = limits.pool_timeout_s
    client = sentinel.master_for(
        settings.redis_master_name, connection_pool_class=pool_class, **options
    )
    client.auto_close_connection_pool = True
    return cast(Redis, client)


def _cluster_client(settings: RedisSettings, limits: PoolLimits) -> Redis:
    creds = _credentials(settings)
    creds.pop("db")  # a cluster has database 0 only
    options = _failover_options(settings, limits)
    if limits.max_connections is not None:
        options["max_connections"] = limits.max_connections  # per cluster node
    client = RedisCluster(
        startup_nodes=[ClusterNode(*parse_address(a)) for a in settings.redis_cluster_nodes],
        **creds,
        **options,
    )
    # Typed as Redis for its callers: see the module's docstring.
    return cast(Redis, client)


async def server_identity(redis: Redis) -> str:
    """Which server answers as primary: its `run_id` (a new one after a restart or when a
    replica was promoted); on a cluster, every primary's address and run_id."""
    if isinstance(redis, RedisCluster):
        infos = await redis.info("server", target_nodes=RedisCluster.PRIMARIES)
        return ",".join(f"{node}={info.get('run_id', '')}" for node, info in sorted(infos.items()))
    info = await redis.info("server")
    return str(info.get("run_id", ""))
