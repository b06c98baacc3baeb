"""The pytest fixture of a local three-primary Redis Cluster (services/cli/redis_cluster.py)
on free ports, and the client helpers tests use with it. Import the fixture where it is used:
`from tests.common.redis_cluster import redis_cluster  # noqa: F401`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from services.cli.ports import free_port
from services.cli.redis_cluster import LocalCluster, start_cluster

CLUSTER_PASSWORD = "tests-redis-cluster-password"


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three primaries, no replicas (a killed primary's slots are down until it is back)."""
    cluster = start_cluster(
        folder=tmp_path_factory.mktemp("redis-cluster"),
        password=CLUSTER_PASSWORD,
        ports=[free_port() for _ in range(3)],
    )
    yield cluster
    cluster.stop()


def cluster_client(cluster: LocalCluster) -> RedisCluster:
    """An asyncio RedisCluster client of `cluster` (MOVED/ASK followed by redis-py)."""
    nodes = [ClusterNode(s.rpartition(":")[0], int(s.rpartition(":")[2])) for s in cluster.seeds]
    return RedisCluster(startup_nodes=nodes, password=cluster.password)


@pytest.fixture
async def cluster_redis(redis_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    client = cluster_client(redis_cluster)
    await client.initialize()
    yield client
    await client.aclose()
