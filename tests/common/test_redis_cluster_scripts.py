"""Every Redis script and multi-key step of the mesh, run against a real three-primary Redis
Cluster (tests/common/redis_cluster.py): redis-py refuses a call whose keys span slots, and
Redis refuses a script that touches a key of another slot, so each test fails on a key
layout that is not cluster-ready. Tenants are picked on different shards."""

from __future__ import annotations

import asyncio
import uuid

from redis.asyncio.cluster import RedisCluster

from services.cli.redis_cluster import LocalCluster
from services.common.quota_keys import limits_key
from services.common.subscription_counts import SubscriptionCounts
from services.metrics.shared import SharedReports
from services.queue.leases import LeaseTable
from services.quota.api import QuotaApi
from services.router.cluster import Generations, Lease
from services.session.flapping import FlapDetector
from services.session.liveness import SeenRecords
from services.session.registry import Holder, Registry
from services.session.registry_keys import generation_key
from starling.quota.v1 import quota_pb2 as qpb
from tests.common.redis_cluster import (
    cluster_redis,  # noqa: F401  (the fixture)
    redis_cluster,  # noqa: F401  (the fixture)
)
from tests.poll import eventually


async def _tenants_on_shards(redis: RedisCluster, shards: int = 3) -> list[str]:
    """One tenant per primary (by the slot of its hash tag)."""
    seen: dict[str, str] = {}
    while len(seen) < shards:
        tenant = f"t{uuid.uuid4().hex[:8]}"
        node = redis.get_node_from_key("{" + tenant + "}")
        seen.setdefault(node.name, tenant)
    return list(seen.values())


def _holder(tenant: str, client_id: str, node: str, epoch: int, user: str = "u") -> Holder:
    return Holder(tenant=tenant, client_id=client_id, node_id=node, epoch=epoch, username=user)


async def test_registry_claims_releases_and_finds_a_nodes_clients(
    cluster_redis: RedisCluster,  # noqa: F811
) -> None:
    reg = Registry(cluster_redis)  # type: ignore[arg-type]
    tenants = await _tenants_on_shards(cluster_redis)
    for t in tenants:
        await cluster_redis.hset(limits_key(t), mapping={"max_sessions": 5})
    # One event-loop turn: the pipelined claims of three shards go together.
    claims = await asyncio.gather(
        *(
            reg.claim(_holder(t, "c1", "n1", reg.next_epoch()), max_clients=2, persistent=True)
            for t in tenants
        )
    )
    assert all(c.won for c in claims)
    second = await reg.claim(_holder(tenants[0], "c2", "n2", reg.next_epoch()), max_clients=2)
    assert second.won
    full = await reg.claim(_holder(tenants[0], "c3", "n2", reg.next_epoch()), max_clients=2)
    assert full.full and full.cap == 2
    assert await reg.sessions(tenants[1]) == 1
    assert await reg.connections_of_user(tenants[0], "u") == 2
    assert sorted(await reg.known_nodes()) == ["n1", "n2"]
    assert sorted(await reg.held_by("n1")) == sorted((t, "c1") for t in tenants)
    # A takeover on another node: later epoch wins, and the old node no longer lists it after
    # its end.
    moved = await reg.claim(_holder(tenants[1], "c1", "n2", reg.next_epoch()))
    assert moved.won and moved.previous is not None and moved.previous.node_id == "n1"
    assert await reg.end(tenants[1], "c1", claims[1].epoch, "n1") == 0
    assert (await reg.get(tenants[1], "c1")).node_id == "n2"  # type: ignore[union-attr]
    assert await reg.release(tenants[2], "c1", claims[2].epoch)
    await reg.forget_on_node("n1", tenants[2], "c1")
    assert await reg.held_by("n1") == [(tenants[0], "c1")]
    await reg.drop_node("n1")
    assert await reg.held_by("n1") == []
    assert [h.client_id for h in await reg.list(tenants[0])] == ["c1", "c2"]
    await reg.session_ended(tenants[1], "c1")
    assert await reg.sessions(tenants[1]) == 0
    reclaim = await reg.reclaim(_holder(tenants[2], "c9", "n3", reg.next_epoch()))
    assert reclaim.won


async def test_a_shard_restarted_empty_is_noticed_by_claims_and_by_the_check(
    redis_cluster: LocalCluster,  # noqa: F811
    cluster_redis: RedisCluster,  # noqa: F811
) -> None:
    """The generation sentinel is per tenant (in the tenant's slot): one shard losing its
    data alone is noticed for the tenants it held, by a CONNECT or the periodic check."""
    reg = Registry(cluster_redis)  # type: ignore[arg-type]
    tenants = await _tenants_on_shards(cluster_redis)
    for t in tenants:
        await reg.claim(_holder(t, "c", "n1", reg.next_epoch()))
    await reg.check_generation()  # settles whatever earlier tests left
    assert await reg.check_generation() is None
    # A shard "loses its data": the keys of one tenant's slot go (a FLUSHALL of that primary
    # would also take other tests' keys; the restart case is the fault test's).
    lost = tenants[1]
    await cluster_redis.delete(generation_key(lost))
    assert await reg.check_generation() is not None
    assert await reg.check_generation() is None
    await cluster_redis.delete(generation_key(lost))
    again = await reg.claim(_holder(lost, "c", "n2", reg.next_epoch()))
    assert again.won and again.generation


async def test_scripts_survive_a_script_flush(cluster_redis: RedisCluster) -> None:  # noqa: F811
    """Pipelined and batched calls by digest load their script again on every primary."""
    reg = Registry(cluster_redis)  # type: ignore[arg-type]
    flap = FlapDetector(cluster_redis, max_connects=3, window_s=10)
    tenants = await _tenants_on_shards(cluster_redis)
    await cluster_redis.script_flush()
    results = await asyncio.gather(
        *(reg.claim(_holder(t, "c", "n1", reg.next_epoch())) for t in tenants),
        *(flap.connected(t, "c", f"192.0.2.{i}:1", 0) for i, t in enumerate(tenants)),
    )
    assert [r.won for r in results[:3]] == [True] * 3  # type: ignore[union-attr]
    assert results[3:] == [None] * 3


async def test_flapping_counts_of_many_addresses_in_one_turn(
    cluster_redis: RedisCluster,  # noqa: F811
) -> None:
    flap = FlapDetector(cluster_redis, max_connects=2, window_s=10, max_per_address=100)
    cid = uuid.uuid4().hex
    out = await asyncio.gather(
        *(flap.connected("t", cid, f"198.51.100.{i % 20}:1", i) for i in range(60))
    )
    flapped = [f for f in out if f is not None]
    assert len(flapped) == 20  # the third CONNECT from each address
    assert {f.address for f in flapped} == {f"198.51.100.{i}" for i in range(20)}


async def _redis_ms(redis: RedisCluster) -> int:
    seconds, micros = await redis.time()  # type: ignore[misc]
    return int(seconds) * 1000 + int(micros) // 1000


async def _later(redis: RedisCluster, ms: int) -> bool:
    return await _redis_ms(redis) > ms


async def test_liveness_records(cluster_redis: RedisCluster) -> None:  # noqa: F811
    seen = SeenRecords(cluster_redis, key=f"st:nodes:seen:{uuid.uuid4().hex}")  # type: ignore[arg-type]
    assert await seen.heard("n1") == 0
    assert await seen.heard("n1") == 1
    await seen.learn(["n2"])
    # "Older than 0 s" needs the server's clock past the records' millisecond.
    recorded = await _redis_ms(cluster_redis)
    await eventually(lambda: _later(cluster_redis, recorded), what="the next millisecond")
    claimed, gone = await seen.claim(["n1", "n2", "n3"], timeout_s=0.0)
    assert {c[0] for c in claimed} == {"n1", "n2"} and gone == ["n3"]
    mark = await seen.keep("n1", claimed[0][2])
    await seen.done("n1", mark)
    assert await seen.nodes() == ["n2"]


async def test_quota_leases_and_subscription_counts(
    cluster_redis: RedisCluster,  # noqa: F811
) -> None:
    tenants = await _tenants_on_shards(cluster_redis)
    api = QuotaApi(cluster_redis, lease_ttl_ms=1000, bans=None)  # type: ignore[arg-type]
    counts = SubscriptionCounts(cluster_redis)  # type: ignore[arg-type]
    for t in tenants:
        await cluster_redis.hset(
            limits_key(t), mapping={"max_messages_per_s": 10, "max_tenant_subscriptions": 5}
        )
        await cluster_redis.hset(limits_key(t, "u"), mapping={"max_connections": 1})
        rate = await api.AcquireLease(
            qpb.AcquireLeaseRequest(tenant=t, resource="messages_per_s", amount=8, node_id="n1"),
            None,  # type: ignore[arg-type]
        )
        user = await api.AcquireLease(
            qpb.AcquireLeaseRequest(
                tenant=t, user="u", resource="connections", amount=3, node_id="n1"
            ),
            None,  # type: ignore[arg-type]
        )
        assert (rate.granted, user.granted) == (8, 1)
        assert await counts.hold(t, "n1", held=2, amount=4) == (3, 5)
        assert await counts.total(t) == 5
    await counts.drop_node("n1")
    assert [await counts.total(t) for t in tenants] == [0, 0, 0]


async def test_queue_partition_leases(cluster_redis: RedisCluster) -> None:  # noqa: F811
    prefix = f"t:{uuid.uuid4().hex}:"
    a = LeaseTable(cluster_redis, "a", 8, 5000, prefix)
    b = LeaseTable(cluster_redis, "b", 8, 5000, prefix)
    first = await a.tick()
    assert len(first.owned) == 8
    await b.tick()
    view = await a.tick()  # b is a member now: a holds more than its share
    assert view.share == 4 and view.members == 2
    await a.release(sorted(view.owned)[4:])
    await a.leave()
    assert len((await b.tick()).owned) == 4


async def test_router_lease_generations_and_metrics_reports(
    cluster_redis: RedisCluster,  # noqa: F811
) -> None:
    name = uuid.uuid4().hex
    assert await Lease(cluster_redis, name, "r1").renew()
    assert not await Lease(cluster_redis, name, "r2").renew()
    gens = Generations(cluster_redis)
    key = f"retained:{name}"
    gens.adopt(key, 0)
    await gens.wrote(key)
    assert await gens.stale(key) is None
    reports = SharedReports(cluster_redis)
    reporter = f"node-{name}"
    assert (await reports.swap(reporter, 2, 10, b"r", "node"))[0]
    assert not (await reports.swap(reporter, 1, 11, b"old", "node"))[0]
    latest = {r[0]: r for r in await reports.latest()}  # SCAN on every primary
    assert latest[reporter][1:] == (10, "node", b"r")
