"""The NATS JetStream action: each output published to a subject rendered from a template,
waiting for the stream's ack (a stored message), with `Nats-Msg-Id` set to
`<rule_id>:<message_id>` so a retried publish is dropped as a duplicate within the stream's
duplicate window.

Params: `subject` (template; `${topic}` becomes one token per topic level, other values one
token each; default `${topic}`), `stream` (the stream expected to take the subject; empty: any),
`url` (a NATS server of the user's, credentials in it accepted; empty: the rules service's
own connection), `timeout_ms` (ack wait, default 5000).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import nats

from services.rules.actions.base import ActionContext, Output, PermanentActionError
from services.rules.actions.params import Params
from services.rules.actions.templates import Template, token_value, topic_as_tokens


class NatsJetStreamAction:
    def __init__(
        self,
        ctx: ActionContext,
        url: str | None,
        subject: Template,
        stream: str | None,
        timeout_s: float,
    ) -> None:
        self._ctx = ctx
        self._url = url
        self._subject = subject
        self._stream = stream
        self._timeout_s = timeout_s
        self._own: Any = None  # our own connection when `url` is set
        self._js: Any = None

    async def start(self) -> None:
        if self._js is not None:
            return
        if self._url:
            self._own = await nats.connect(
                self._url, name=f"starling-rule-{self._ctx.rule_id}", max_reconnect_attempts=-1
            )
            nc = self._own
        else:
            nc = self._ctx.nats
            if nc is None:
                raise PermanentActionError("url: no NATS connection (set the url param)")
        self._js = nc.jetstream(timeout=self._timeout_s)

    async def send(self, outputs: Sequence[Output]) -> None:
        if self._js is None:
            await self.start()
        js = self._js
        calls = []
        for o in outputs:
            subject = self._subject.render(o)
            calls.append(
                js.publish(
                    subject,
                    o.payload,
                    stream=self._stream,
                    headers={"Nats-Msg-Id": f"{o.rule_id}:{o.message_id}"},
                )
            )
        # Every publish settles before a failure is raised: none is left running unseen.
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                raise r

    async def close(self) -> None:
        if self._own is not None:
            await self._own.drain()
            self._own = None
        self._js = None


def build(p: Params, ctx: ActionContext) -> NatsJetStreamAction:
    subject = Template(p.text("subject", "${topic}"), "subject", token_value, topic_as_tokens)
    bad = [c for c in subject.text.replace("${", "").replace("}", "") if c in "*> \t"]
    if bad:
        raise ValueError(f"subject: a publish subject cannot hold {bad[0]!r}")
    url = p.opt("url")
    if url is not None and not url.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise ValueError(f"url: {url!r} is not a NATS URL")
    stream = p.opt("stream")
    timeout_s = p.integer("timeout_ms", 5000, 1, 600_000) / 1000
    return NatsJetStreamAction(ctx, url, subject, stream, timeout_s)
