"""The Kafka action (aiokafka): an idempotent producer with `acks=all`; `send` returns once
the leader and its in-sync replicas stored every output of the batch.

Params: `bootstrap_servers` (host:port[,host:port], required), `topic` (template; values and
`${topic}` made of Kafka's topic characters, levels joined by `.`; required), `key` (template
of the record key, default `${clientid}`: one device's records stay in order on one
partition), `client_id` (default `starling-<tenant>-<rule_id>`), `security_protocol`
(PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL), `sasl_mechanism` (PLAIN|SCRAM-SHA-256|SCRAM-SHA-512),
`username`, `password`, `ca_file`, `linger_ms` (default 5), `timeout_ms` (default 30000).
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence
from typing import Any

from services.rules.actions.base import ActionContext, Output
from services.rules.actions.params import Params
from services.rules.actions.templates import Template


def kafka_value(value: str) -> str:
    """Kafka topic names allow [A-Za-z0-9._-] only."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", value) or "_"


def kafka_topic(topic: str) -> str:
    return ".".join(kafka_value(level) for level in topic.split("/"))


class KafkaAction:
    def __init__(self, config: dict[str, Any], topic: Template, key: Template) -> None:
        self._config = config
        self._topic = topic
        self._key = key
        self._producer: Any = None

    async def start(self) -> None:
        pass  # connect on first send: a cluster that is down must not stop the rule loading

    async def send(self, outputs: Sequence[Output]) -> None:
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(**self._config)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        pending = [
            await self._producer.send(
                self._topic.render(o)[:249],
                o.payload,
                key=self._key.render(o).encode(),
                timestamp_ms=o.published_at_ms or None,
                headers=[("topic", o.topic.encode()), ("message_id", o.message_id.encode())],
            )
            for o in outputs
        ]
        # Every record settles before a failure is raised.
        for r in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(r, BaseException):
                raise r

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


def build(p: Params, ctx: ActionContext) -> KafkaAction:
    servers = p.text("bootstrap_servers")
    for server in servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bootstrap_servers: {server!r} is not host:port")
    topic = Template(p.text("topic"), "topic", kafka_value, kafka_topic)
    key = Template(p.text("key", "${clientid}"), "key", lambda v: v)
    protocol = p.choice(
        "security_protocol", "PLAINTEXT", ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
    )
    config: dict[str, Any] = {
        "bootstrap_servers": servers,
        "client_id": p.text("client_id", f"starling-{ctx.tenant}-{ctx.rule_id}"),
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": p.integer("linger_ms", 5, 0, 60_000),
        "request_timeout_ms": p.integer("timeout_ms", 30_000, 1000, 600_000),
        "security_protocol": protocol,
    }
    ca_file = p.file("ca_file")
    if protocol in ("SSL", "SASL_SSL"):
        config["ssl_context"] = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    if protocol.startswith("SASL"):
        config["sasl_mechanism"] = p.choice(
            "sasl_mechanism", "PLAIN", ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        )
        config["sasl_plain_username"] = p.text("username")
        config["sasl_plain_password"] = p.text("password")
    return KafkaAction(config, topic, key)
