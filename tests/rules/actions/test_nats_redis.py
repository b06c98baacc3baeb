"""NATS JetStream and Redis Streams actions against the real servers of tests/conftest.py:
the transformed payloads arrive where the templates say, values cannot split subjects, a
missing stream ends in dead letters that a replay delivers once the stream exists."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis

from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, RetryPolicy, replay
from tests.rules.actions.helpers import RecordingRepublisher, output

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_s=10)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


def ctx(tmp_path: Path, nc: object = None) -> ActionContext:
    return ActionContext(RecordingRepublisher(), nc, tmp_path, "t1", "r1")  # type: ignore[arg-type]


async def test_nats_jetstream_publish_with_ack(
    nats_url: str, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    name = "RULES" + uuid.uuid4().hex[:6].upper()
    js = nc.jetstream()
    try:
        # The action on the service's own connection; the stream the test creates.
        params = {"subject": f"{name}.${{clientid}}.${{topic}}", "stream": name}
        action = build_action("nats", params, ctx(tmp_path, nc))
        d = Delivery(action, "t1", "r1", store, FAST, action_name="js")
        await d.start()
        outcome = await d.deliver([output(1)])
        assert not outcome.delivered  # no stream takes the subject yet
        assert (await store.stats("t1", "r1")).count == 1
        await js.add_stream(name=name, subjects=[f"{name}.>"])
        result = await replay(store, "t1", "r1", [], {"js": d})
        assert result.delivered == 1
        outs = [output(2), output(3, topic="a.b/c d", clientid="dev.*>")]
        assert (await d.deliver(outs)).delivered
        sub = await js.pull_subscribe(f"{name}.>", durable="check")
        msgs = await sub.fetch(3, timeout=5)
        assert [(m.subject, json.loads(m.data)["i"]) for m in msgs] == [
            (f"{name}.dev-1.sensors.a.temp", 1),
            (f"{name}.dev-1.sensors.a.temp", 2),
            (f"{name}.dev___.a_b.c_d", 3),  # a value stays one token
        ]
        assert msgs[0].headers is not None and msgs[0].headers["Nats-Msg-Id"] == "r1:m1"
        # A retried publish of the same output is a duplicate the stream drops.
        assert (await d.deliver([output(2)])).delivered
        info = await js.stream_info(name)
        assert info.state.messages == 3
        await d.close()
    finally:
        await nc.close()


async def test_nats_own_connection_by_url(
    nats_url: str, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    name = "OWN" + uuid.uuid4().hex[:6].upper()
    try:
        await nc.jetstream().add_stream(name=name, subjects=[f"{name}.>"])
        action = build_action("nats", {"url": nats_url, "subject": f"{name}.x"}, ctx(tmp_path))
        d = Delivery(action, "t1", "r1", store, FAST, action_name="js")
        await d.start()
        assert (await d.deliver([output(5)])).delivered
        info = await nc.jetstream().stream_info(name)
        assert info.state.messages == 1
        await d.close()
    finally:
        await nc.close()


async def test_redis_streams_xadd_pipelined_and_capped(
    redis_url: str, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    key = "rules-" + uuid.uuid4().hex[:6]
    action = build_action(
        "redis", {"url": redis_url, "stream": key + ":${clientid}", "maxlen": "100"}, ctx(tmp_path)
    )
    d = Delivery(action, "t1", "r1", store, FAST, action_name="rs")
    await d.start()
    r = aioredis.from_url(redis_url)
    try:
        assert (await d.deliver([output(i) for i in range(3)])).delivered
        entries = await r.xrange(f"{key}:dev-1")
        assert [json.loads(f[b"payload"])["i"] for _, f in entries] == [0, 1, 2]
        assert entries[0][1][b"topic"] == b"sensors/a/temp"
        assert entries[0][1][b"message_id"] == b"m0"
        # MAXLEN ~ keeps the stream bounded however much arrives.
        for start in range(0, 2000, 200):
            assert (await d.deliver([output(i) for i in range(start, start + 200)])).delivered
        assert await r.xlen(f"{key}:dev-1") < 300
    finally:
        await r.aclose()
        await d.close()


async def test_redis_unreachable_dead_letters(store: SqliteDeadLetters, tmp_path: Path) -> None:
    from services.cli.ports import free_port

    action = build_action(
        "redis", {"url": f"redis://127.0.0.1:{free_port()}/0", "stream": "s"}, ctx(tmp_path)
    )
    d = Delivery(action, "t1", "r1", store, FAST, action_name="rs")
    await d.start()
    try:
        outcome = await d.deliver([output(1)])
        assert not outcome.delivered and outcome.attempts == 2
        assert (await store.stats("t1", "r1")).count == 1
    finally:
        await d.close()


@pytest.mark.parametrize(
    ("kind", "params", "named"),
    [
        ("nats", {"subject": "a.*"}, "subject"),
        ("nats", {"url": "http://x"}, "url"),
        ("redis", {}, "url"),
        ("redis", {"url": "redis://h", "maxlen": "0"}, "maxlen"),
    ],
)
def test_bad_params_name_the_param(
    kind: str, params: dict[str, str], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=rf"^{named}:"):
        build_action(kind, params, ctx(tmp_path))
