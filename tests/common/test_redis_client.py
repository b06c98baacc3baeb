"""The Redis settings and the one client factory (services/common/redis_settings.py,
services/common/redis_client.py): an inconsistent deployment stops at start naming the
setting; each mode gets its kind of client; a standalone client talks to a real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from services.common.config import ConfigError, load_settings
from services.common.redis_client import PoolLimits, failover_retries, redis_client
from services.session.config import SessionSettings

OPEN = {"admin_auth": "disabled", "mesh_auth": "disabled"}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"redis_mode": "sentinel"}, "redis_sentinels (STARLING_REDIS_SENTINELS)"),
        ({"redis_mode": "cluster"}, "redis_cluster_nodes (STARLING_REDIS_CLUSTER_NODES)"),
        ({"redis_sentinels": ["127.0.0.1:26379"]}, "set redis_mode=sentinel"),
        ({"redis_cluster_nodes": ["127.0.0.1:7000"]}, "set redis_mode=cluster"),
        ({"redis_mode": "sentinel", "redis_sentinels": ["nohost"]}, "redis_sentinels"),
        ({"redis_mode": "replicated"}, "redis_mode (STARLING_REDIS_MODE)"),
    ],
)
def test_inconsistent_redis_settings_stop_start_up_naming_the_setting(
    settings: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        load_settings(SessionSettings, **OPEN, **settings)


def test_sentinel_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_REDIS_MODE", "sentinel")
    monkeypatch.setenv("STARLING_REDIS_SENTINELS", '["127.0.0.1:26379", "[::1]:26380"]')
    monkeypatch.setenv("STARLING_REDIS_SENTINEL_PASSWORD", "s3cret")
    s = load_settings(SessionSettings, **OPEN)
    assert s.redis_sentinels == ["127.0.0.1:26379", "[::1]:26380"]
    assert s.redacted()["redis_sentinel_password"] == "***"
    client = redis_client(s, PoolLimits(max_connections=7, pool_timeout_s=1.0))
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "starling" and pool.max_connections == 7


def test_cluster_mode_gets_a_cluster_client() -> None:
    s = load_settings(
        SessionSettings, **OPEN, redis_mode="cluster", redis_cluster_nodes=["127.0.0.1:7000"]
    )
    assert isinstance(redis_client(s), RedisCluster)


def test_failover_retries_cover_the_wait() -> None:
    assert failover_retries(0) == 0
    # 0.05 + 0.1 + 0.2 + 0.4 = 0.75 s, then 0.5 s steps.
    assert failover_retries(0.75) == 4
    assert failover_retries(15.0) == 4 + 29


async def test_standalone_client_talks_to_redis(redis_url: str) -> None:
    s = load_settings(SessionSettings, **OPEN, redis_url=redis_url)
    client = redis_client(s, PoolLimits(max_connections=2, pool_timeout_s=1.0, retries=2))
    try:
        assert await client.ping()
        assert client.connection_pool.max_connections == 2
    finally:
        await client.aclose()
