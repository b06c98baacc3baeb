"""MQTT bridges against a real Mosquitto (password and TLS): outputs arrive on the rendered
topic, a column cannot inject wildcards, a broker outage ends in dead letters that a replay
delivers once it is back, and the bridge in publishes remote messages into the tenant and
acknowledges them only once taken."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomqtt
import pytest

from services.rules.actions import ActionContext, build_action, build_source
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, RetryPolicy, replay
from services.rules.actions.mqtt_bridge import MqttBridgeIn
from tests.poll import eventually
from tests.rules.actions.helpers import RecordingRepublisher, output
from tests.rules.actions.servers import MQTT_PASSWORD, MQTT_USER, Mosquitto, mosquitto

FAST = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.05, max_retry_s=10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    m = mosquitto(tmp_path)
    m.start()
    yield m
    m.stop()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


def remote(broker: Mosquitto, tls: bool = True) -> dict[str, str]:
    params = {"host": "127.0.0.1", "username": MQTT_USER, "password": MQTT_PASSWORD}
    if tls:
        params |= {"tls": "true", "port": str(broker.tls_port), "ca_file": str(broker.cert)}
    else:
        params |= {"port": str(broker.port)}
    return params


async def collect(
    broker: Mosquitto, topic_filter: str, got: list[aiomqtt.Message], ready: asyncio.Event
) -> None:
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, username=MQTT_USER, password=MQTT_PASSWORD
    ) as c:
        await c.subscribe(topic_filter, 1)
        ready.set()
        async for m in c.messages:
            got.append(m)


async def test_bridge_out_over_tls_delivers_to_the_rendered_topic(
    broker: Mosquitto, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    got: list[aiomqtt.Message] = []
    ready = asyncio.Event()
    sub = asyncio.create_task(collect(broker, "bridged/#", got, ready))
    ctx = ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")
    action = build_action(
        "mqtt_bridge", {**remote(broker), "topic": "bridged/${clientid}/${room}", "qos": "1"}, ctx
    )
    d = Delivery(action, "t1", "r1", store, FAST, action_name="out")
    await d.start()
    try:
        await asyncio.wait_for(ready.wait(), 10)
        outs = [
            output(1, {"t": 31, "room": "kitchen"}),
            output(2, {"t": 32, "room": "a/+/#"}),  # must not become levels or wildcards
        ]
        outcome = await d.deliver(outs)
        assert outcome.delivered
        await eventually(lambda: len(got) == 2, what="two bridged messages")
        by_topic = {m.topic.value: json.loads(m.payload) for m in got}  # type: ignore[arg-type]
        assert by_topic == {
            "bridged/dev-1/kitchen": {"t": 31, "room": "kitchen"},
            "bridged/dev-1/a%2F%2B%2F%23": {"t": 32, "room": "a/+/#"},
        }
    finally:
        sub.cancel()
        await d.close()


async def test_broker_outage_dead_letters_then_replay_delivers(
    broker: Mosquitto, store: SqliteDeadLetters, tmp_path: Path
) -> None:
    ctx = ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")
    action = build_action("mqtt_bridge", {**remote(broker, tls=False), "qos": "1"}, ctx)
    d = Delivery(action, "t1", "r1", store, FAST, action_name="out")
    await d.start()
    try:
        assert (await d.deliver([output(0)])).delivered
        broker.stop()
        outcome = await d.deliver([output(1), output(2)])
        assert not outcome.delivered and outcome.attempts == 2
        assert [x.output.message_id for x in await store.list("t1", "r1")] == ["m1", "m2"]
        broker.start()
        got: list[aiomqtt.Message] = []
        ready = asyncio.Event()
        sub = asyncio.create_task(collect(broker, "sensors/#", got, ready))
        await asyncio.wait_for(ready.wait(), 10)
        result = await replay(store, "t1", "r1", [], {"out": d})
        assert (result.delivered, result.failed) == (2, 0)
        await eventually(lambda: len(got) == 2, what="replayed messages")
        assert sorted(json.loads(m.payload)["i"] for m in got) == [1, 2]  # type: ignore[arg-type]
        assert await store.list("t1", "r1") == []
        sub.cancel()
    finally:
        await d.close()


class FlakyRepublisher(RecordingRepublisher):
    """Fails its first `failures` publishes (the mesh was unreachable)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def publish(self, *args: object, **kw: object) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("mesh unreachable")
        await super().publish(*args, **kw)  # type: ignore[arg-type]


async def test_bridge_in_publishes_into_the_tenant_and_acks_only_once_taken(
    broker: Mosquitto, tmp_path: Path
) -> None:
    republisher = FlakyRepublisher(failures=1)
    ctx = ActionContext(republisher, None, tmp_path, "t9", "r9")
    source = build_source(
        "mqtt_bridge_in",
        {**remote(broker), "remote_topic": "plant/+/temp", "local_topic": "remote/${topic}"},
        ctx,
    )
    assert isinstance(source, MqttBridgeIn)
    await source.start()
    try:
        await asyncio.wait_for(source.connected.wait(), 10)
        async with aiomqtt.Client(
            "127.0.0.1", broker.port, username=MQTT_USER, password=MQTT_PASSWORD
        ) as pub:
            await pub.publish("plant/p1/temp", b'{"t": 21}', qos=1)
            await pub.publish("other/topic", b"not bridged", qos=1)
        # The first try failed; the remote broker sent it again after the reconnect.
        await eventually(lambda: len(republisher.published) == 1, what="bridged in message")
        [msg] = republisher.published
        assert (msg.tenant, msg.topic, msg.payload, msg.qos) == (
            "t9",
            "remote/plant/p1/temp",
            b'{"t": 21}',
            1,
        )
    finally:
        await source.close()


@pytest.mark.parametrize(
    ("kind", "params", "named"),
    [
        ("mqtt_bridge", {}, "host"),
        ("mqtt_bridge", {"host": "h", "port": "0"}, "port"),
        ("mqtt_bridge", {"host": "h", "password": "p"}, "password"),
        ("mqtt_bridge", {"host": "h", "qos": "3"}, "qos"),
        ("mqtt_bridge", {"host": "h", "protocol": "4"}, "protocol"),
        ("mqtt_bridge", {"host": "h", "topic": "a/${"}, "topic"),
        ("mqtt_bridge_in", {"host": "h"}, "remote_topic"),
        ("mqtt_bridge_in", {"host": "h", "remote_topic": "a/#/b"}, "remote_topic"),
    ],
)
def test_bad_params_name_the_param(
    kind: str, params: dict[str, str], named: str, tmp_path: Path
) -> None:
    ctx = ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")
    build = build_source if kind == "mqtt_bridge_in" else build_action
    with pytest.raises(ValueError, match=rf"^{named}:"):
        build(kind, params, ctx)
