"""The Redis Streams action: each output XADDed to a stream whose key is rendered from a
template, one pipeline (one round trip) per batch, the stream capped with MAXLEN ~.

Entry fields: `payload`, `topic`, `clientid`, `message_id`, `qos`, `published_at_ms`.
Params: `url` (redis:// or rediss://, password in it accepted; required), `stream` (key
template, default `${topic}`), `maxlen` (approximate cap per stream, default 100000).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from services.rules.actions.base import ActionContext, Output
from services.rules.actions.params import Params
from services.rules.actions.templates import Template


def _as_is(value: str) -> str:
    return value  # a key is any string: nothing to escape


class RedisStreamsAction:
    def __init__(self, url: str, stream: Template, maxlen: int) -> None:
        self._url = url
        self._stream = stream
        self._maxlen = maxlen
        self._redis: aioredis.Redis | None = None

    async def start(self) -> None:
        if self._redis is None:
            self._redis = aioredis.from_url(self._url, socket_timeout=10)

    async def send(self, outputs: Sequence[Output]) -> None:
        if self._redis is None:
            await self.start()
        assert self._redis is not None
        async with self._redis.pipeline(transaction=False) as pipe:
            for o in outputs:
                pipe.xadd(
                    self._stream.render(o),
                    {
                        "payload": o.payload,
                        "topic": o.topic,
                        "clientid": o.clientid,
                        "message_id": o.message_id,
                        "qos": o.qos,
                        "published_at_ms": o.published_at_ms,
                    },
                    maxlen=self._maxlen,
                    approximate=True,
                )
            await pipe.execute()

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None


def build(p: Params, ctx: ActionContext) -> RedisStreamsAction:
    url = p.text("url")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"url: {url!r} is not a Redis URL")
    stream = Template(p.text("stream", "${topic}"), "stream", _as_is)
    return RedisStreamsAction(url, stream, p.integer("maxlen", 100_000, 1, 1_000_000_000))
