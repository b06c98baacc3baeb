"""The rules service's consumption of the RULES stream, in this process against the test NATS
and Redis: messages already waiting in the stream when an instance starts reach their rules,
and so do messages stored for a rule this instance was never told of (created through another
instance whose push it missed) -- neither is acknowledged without its outputs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis

from services.common.bus import subjects
from services.common.store.ports_rules import RuleRecord
from services.common.store.sqlite_rules import SqliteRuleStore
from services.rules.config import RulesSettings
from services.rules.consumer import rules_stream_config
from services.rules.main import RulesService
from starling.common.v1.message_pb2 import RoutedMessage
from tests.conftest import NATS_PASSWORD, NATS_USER
from tests.poll import holds_within_async


def settings(nats_url: str, data_dir: Path) -> RulesSettings:
    return RulesSettings(
        nats_url=nats_url,
        nats_user=NATS_USER,
        nats_password=NATS_PASSWORD,
        data_dir=data_dir,
        rules_ack_wait_s=2,
    )


async def put_rule(data_dir: Path, tenant: str, topic: str, redis_url: str, key: str) -> None:
    """Store a rule the way another instance's CreateRule does, telling no one."""
    store = SqliteRuleStore(data_dir / "rules.db")
    now = int(time.time() * 1000)
    actions = [{"kind": "redis", "params": {"url": redis_url, "stream": key}}]
    sql = f'SELECT payload FROM "{topic}"'
    await store.put_rule(RuleRecord(tenant, "r1", sql, json.dumps(actions), True, now, now))
    await store.close()


async def feed(nats_url: str, tenant: str, topic: str, n: int) -> None:
    """What a node does for a QoS 1 publish some rule reads: store it, wait for the ack."""
    nc = await nats.connect(nats_url, user=NATS_USER, password=NATS_PASSWORD)
    js = nc.jetstream()
    defaults = RulesSettings.model_fields
    cfg = rules_stream_config(
        defaults["rules_stream_max_age_s"].default, defaults["rules_stream_max_bytes"].default
    )
    await js.add_stream(cfg)  # as the rules service creates it
    for i in range(n):
        env = RoutedMessage(
            tenant=tenant,
            topic=topic,
            payload=str(i).encode(),
            qos=1,
            published_at_ms=int(time.time() * 1000),
            message_id=f"{tenant}-{i}",
        )
        await js.publish(subjects.rules_stream(tenant), env.SerializeToString())
    await nc.close()


async def arrived(r: aioredis.Redis, key: str, n: int, timeout_s: float = 15.0) -> set[int]:
    """The payloads in the stream once `n` are there (or when `timeout_s` is up)."""
    got: set[int] = set()

    async def enough() -> bool:
        got.update(int(f[b"payload"]) for _, f in await r.xrange(key))
        return len(got) >= n

    await holds_within_async(enough, timeout_s, every_s=0.05)  # the caller compares
    return got


@pytest.fixture
async def sink(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    r = aioredis.from_url(redis_url)
    key = f"sink-{uuid.uuid4().hex[:8]}"
    yield r, key
    await r.delete(key)
    await r.aclose()


async def test_messages_waiting_when_an_instance_starts_reach_their_rules(
    nats_url: str, redis_url: str, tmp_path: Path, sink: tuple[aioredis.Redis, str]
) -> None:
    r, key = sink
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    await put_rule(tmp_path, tenant, "a/#", redis_url, key)
    await feed(nats_url, tenant, "a/b", 300)  # stored while no instance runs
    svc = RulesService(settings(nats_url, tmp_path))
    await svc.start()
    try:
        assert await arrived(r, key, 300) == set(range(300))
    finally:
        await svc.stop()


async def test_a_rule_this_instance_was_not_told_of_still_gets_its_messages(
    nats_url: str, redis_url: str, tmp_path: Path, sink: tuple[aioredis.Redis, str]
) -> None:
    r, key = sink
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    svc = RulesService(settings(nats_url, tmp_path))
    await svc.start()
    try:
        # Created through another instance after this one loaded the store; its push to
        # this instance was lost, the nodes heard it and store the tenant's messages.
        await put_rule(tmp_path, tenant, "a/#", redis_url, key)
        await feed(nats_url, tenant, "a/b", 50)
        assert await arrived(r, key, 50) == set(range(50))
    finally:
        await svc.stop()
