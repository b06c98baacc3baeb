"""The RabbitMQ action (aio-pika, AMQP 0-9-1): each output published persistent to an
exchange with a routing key rendered from a template, on a channel with publisher confirms and
`mandatory` set, so `send` returns only once the broker confirmed every message and a message
no queue takes fails (and is retried, then dead-lettered) instead of vanishing.

Params: `url` (amqp:// or amqps://, required), `exchange` (default the default exchange ""),
`exchange_type` (direct|topic|fanout|headers, default topic; used when `declare` is true),
`declare` (declare the exchange durable, default false), `routing_key` (template; `${topic}`
becomes one dot-separated word per level, other values one word each; default `${topic}`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aio_pika

from services.rules.actions.base import ActionContext, Output
from services.rules.actions.params import Params
from services.rules.actions.templates import Template, token_value, topic_as_tokens


class RabbitMqAction:
    def __init__(
        self, url: str, exchange: str, exchange_type: str, declare: bool, routing_key: Template
    ) -> None:
        self._url = url
        self._exchange_name = exchange
        self._exchange_type = exchange_type
        self._declare = declare
        self._routing_key = routing_key
        self._conn: Any = None
        self._exchange: Any = None

    async def start(self) -> None:
        pass  # connect on first send: a broker that is down must not stop the rule loading

    async def _connected(self) -> Any:
        if self._exchange is None:
            conn = await aio_pika.connect_robust(self._url, timeout=10)
            try:
                channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
                exchange: Any
                if self._declare and self._exchange_name:
                    kind = aio_pika.ExchangeType(self._exchange_type)
                    exchange = await channel.declare_exchange(
                        self._exchange_name, kind, durable=True
                    )
                elif self._exchange_name:
                    exchange = await channel.get_exchange(self._exchange_name, ensure=True)
                else:
                    exchange = channel.default_exchange
            except BaseException:
                await conn.close()
                raise
            self._conn, self._exchange = conn, exchange
        return self._exchange

    async def send(self, outputs: Sequence[Output]) -> None:
        messages = [
            (
                self._routing_key.render(o),
                aio_pika.Message(
                    o.payload,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=f"{o.rule_id}:{o.message_id}",
                    timestamp=o.published_at_ms / 1000 if o.published_at_ms else None,
                    headers={"topic": o.topic, "clientid": o.clientid, **dict(o.user_properties)},
                ),
            )
            for o in outputs
        ]
        try:
            exchange = await self._connected()
            results = await asyncio.gather(
                *(exchange.publish(m, routing_key=k, mandatory=True) for k, m in messages),
                return_exceptions=True,
            )
        except Exception:
            await self.close()
            raise
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def close(self) -> None:
        conn, self._conn, self._exchange = self._conn, None, None
        if conn is not None:
            await conn.close()


def build(p: Params, ctx: ActionContext) -> RabbitMqAction:
    url = p.text("url")
    if not url.startswith(("amqp://", "amqps://")):
        raise ValueError(f"url: {url!r} is not an AMQP URL")
    exchange = p.opt("exchange") or ""
    exchange_type = p.choice("exchange_type", "topic", ("direct", "topic", "fanout", "headers"))
    declare = p.flag("declare", False)
    key = Template(p.text("routing_key", "${topic}"), "routing_key", token_value, topic_as_tokens)
    return RabbitMqAction(url, exchange, exchange_type, declare, key)
