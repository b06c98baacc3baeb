"""RabbitMQ (Debian's rabbitmq-server started by the test on free ports) and Kafka (only where
STARLING_TEST_KAFKA names reachable bootstrap servers): the transformed payloads arrive, a
message no queue takes is not lost silently (dead letter, then replay once a queue is bound)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest

from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, RetryPolicy, replay
from tests.rules.actions.helpers import RecordingRepublisher, output
from tests.rules.actions.servers import Rabbit, rabbitmq

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_s=20)
KAFKA = os.environ.get("STARLING_TEST_KAFKA", "")


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rabbit]:
    r = rabbitmq(tmp_path_factory.mktemp("rabbit"))
    yield r
    r.stop()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


def ctx(tmp_path: Path) -> ActionContext:
    return ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")


async def test_rabbitmq_confirmed_publish_to_topic_exchange(
    rabbit: Rabbit, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    exchange = "rules-" + uuid.uuid4().hex[:6]
    params = {
        "url": rabbit.url,
        "exchange": exchange,
        "declare": "true",
        "routing_key": "${clientid}.${topic}",
    }
    d = Delivery(
        build_action("rabbitmq", params, ctx(tmp_path)), "t1", "r1", store, FAST, action_name="amqp"
    )
    await d.start()
    conn = await aio_pika.connect_robust(rabbit.url)
    try:
        # Nothing bound yet: the broker returns the message, which is retried then kept.
        outcome = await d.deliver([output(1)])
        assert not outcome.delivered
        assert (await store.stats("t1", "r1")).count == 1
        channel = await conn.channel()
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(exchange, routing_key="dev-1.sensors.#")
        assert (await replay(store, "t1", "r1", [], {"amqp": d})).delivered == 1
        assert (await d.deliver([output(2), output(3)])).delivered
        got = []
        async with queue.iterator() as it:
            async for message in it:
                async with message.process():
                    got.append((message.routing_key, json.loads(message.body)["i"], message))
                if len(got) == 3:
                    break
        assert [(k, i) for k, i, _ in got] == [
            ("dev-1.sensors.a.temp", 1),
            ("dev-1.sensors.a.temp", 2),
            ("dev-1.sensors.a.temp", 3),
        ]
        first = got[0][2]
        assert first.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert first.headers["topic"] == "sensors/a/temp" and first.message_id == "r1:m1"
    finally:
        await conn.close()
        await d.close()


async def test_rabbitmq_down_dead_letters(store: SqliteDeadLetters, tmp_path: Path) -> None:
    from services.cli.ports import free_port

    params = {"url": f"amqp://guest:guest@127.0.0.1:{free_port()}/"}
    d = Delivery(
        build_action("rabbitmq", params, ctx(tmp_path)), "t1", "r1", store, FAST, action_name="amqp"
    )
    await d.start()
    try:
        outcome = await asyncio.wait_for(d.deliver([output(1)]), 60)
        assert not outcome.delivered
        assert (await store.stats("t1", "r1")).count == 1
    finally:
        await d.close()


async def test_kafka_idempotent_acks_all(store: SqliteDeadLetters, tmp_path: Path) -> None:
    if not KAFKA:
        pytest.skip("Kafka tests need STARLING_TEST_KAFKA=host:port (bootstrap servers)")
    from aiokafka import AIOKafkaConsumer

    topic = "rules-" + uuid.uuid4().hex[:6]
    params = {"bootstrap_servers": KAFKA, "topic": topic + ".${clientid}"}
    d = Delivery(
        build_action("kafka", params, ctx(tmp_path)),
        "t1",
        "r1",
        store,
        RetryPolicy(max_attempts=5, initial_backoff_s=0.5),
        action_name="kafka",
    )
    await d.start()
    consumer = AIOKafkaConsumer(
        f"{topic}.dev-1", bootstrap_servers=KAFKA, auto_offset_reset="earliest"
    )
    try:
        assert (await d.deliver([output(i) for i in range(3)])).delivered
        await consumer.start()
        got = []
        async with asyncio.timeout(60):
            while len(got) < 3:
                batch = await consumer.getmany(timeout_ms=1000)
                for records in batch.values():
                    got += [(r.key, json.loads(r.value)["i"]) for r in records]
        assert got == [(b"dev-1", 0), (b"dev-1", 1), (b"dev-1", 2)]
    finally:
        await consumer.stop()
        await d.close()


@pytest.mark.parametrize(
    ("kind", "params", "named"),
    [
        ("rabbitmq", {}, "url"),
        ("rabbitmq", {"url": "http://x"}, "url"),
        ("rabbitmq", {"url": "amqp://h/", "exchange_type": "x"}, "exchange_type"),
        ("kafka", {"topic": "t"}, "bootstrap_servers"),
        ("kafka", {"bootstrap_servers": "nohost", "topic": "t"}, "bootstrap_servers"),
        ("kafka", {"bootstrap_servers": "h:9092"}, "topic"),
        (
            "kafka",
            {"bootstrap_servers": "h:9092", "topic": "t", "security_protocol": "SASL_SSL"},
            "username",
        ),
    ],
)
def test_bad_params_name_the_param(
    kind: str, params: dict[str, str], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=rf"^{named}:"):
        build_action(kind, params, ctx(tmp_path))
