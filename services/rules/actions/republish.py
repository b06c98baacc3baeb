"""The republish action: each output published back into the mesh, into the rule's tenant,
on a topic rendered from a template (values escaped: a column cannot add wildcards or levels).

Params: `topic` (template, required), `qos` (0-2; default the source message's), `retain`
(default false)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.common.mqtt.errors import TopicNameInvalidError
from services.common.topics.rules import validate_topic_name
from services.rules.actions.base import ActionContext, Output, PermanentActionError, Republisher
from services.rules.actions.params import Params
from services.rules.actions.templates import Template


class RepublishAction:
    def __init__(self, republisher: Republisher, topic: Template, qos: int | None, retain: bool):
        self._republisher = republisher
        self._topic = topic
        self._qos = qos
        self._retain = retain

    async def start(self) -> None:
        pass

    async def send(self, outputs: Sequence[Output]) -> None:
        calls = []
        for o in outputs:
            topic = self._topic.render(o)
            try:
                validate_topic_name(topic)
            except TopicNameInvalidError as exc:
                raise PermanentActionError(f"topic: rendered {topic!r}: {exc}") from None
            qos = o.qos if self._qos is None else self._qos
            calls.append(
                self._republisher.publish(
                    o.tenant, topic, o.payload, qos, self._retain, o.user_properties
                )
            )
        await asyncio.gather(*calls)

    async def close(self) -> None:
        pass


def build(p: Params, ctx: ActionContext) -> RepublishAction:
    topic = Template(p.text("topic"), "topic")
    if topic.text.startswith("$"):
        raise ValueError("topic: cannot republish into a $ topic")
    for bad in "+#":
        if bad in topic.text.replace("${", "").replace("}", ""):
            raise ValueError(f"topic: a topic name cannot hold the wildcard {bad!r}")
    qos_text = p.opt("qos")
    qos = None if qos_text is None else p.integer("qos", 0, 0, 2)
    return RepublishAction(ctx.republisher, topic, qos, p.flag("retain", False))
