"""The republish action: each output published back into the mesh, into the rule's tenant,
on a topic rendered from a template (values escaped: a column cannot add wildcards or levels).
A batch of outputs is one `publish_many` (one router round trip), not a call per output.

Params: `topic` (template, required), `qos` (0-2; default the source message's), `retain`
(default false)."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.mqtt.errors import TopicNameInvalidError
from services.common.topics.rules import validate_topic_name
from services.rules.actions.base import (
    ActionContext,
    Output,
    PermanentActionError,
    Republished,
    Republisher,
)
from services.rules.actions.params import Params
from services.rules.actions.templates import Template

# Rendered topics already found valid, so a topic that recurs (the usual case: a few devices
# or rooms) is checked once; cleared when full so it stays bounded.
_VALID_TOPICS_MAX = 4096


class RepublishAction:
    def __init__(self, republisher: Republisher, topic: Template, qos: int | None, retain: bool):
        self._republisher = republisher
        self._topic = topic
        self._qos = qos
        self._retain = retain
        self._valid: set[str] = set()

    async def start(self) -> None:
        pass

    async def send(self, outputs: Sequence[Output]) -> None:
        render, valid, fixed_qos, retain = self._topic.render, self._valid, self._qos, self._retain
        messages = []
        for o in outputs:
            topic = render(o)
            if topic not in valid:
                self._check(topic)
            qos = o.qos if fixed_qos is None else fixed_qos
            messages.append(Republished(o.tenant, topic, o.payload, qos, retain, o.user_properties))
        await self._republisher.publish_many(messages)

    def _check(self, topic: str) -> None:
        try:
            validate_topic_name(topic)
            if topic.startswith("$"):  # e.g. `${topic}` of a `$events/...` source
                raise TopicNameInvalidError("a $ topic is the broker's own")
        except TopicNameInvalidError as exc:
            raise PermanentActionError(f"topic: rendered {topic!r}: {exc}") from None
        if len(self._valid) >= _VALID_TOPICS_MAX:
            self._valid.clear()
        self._valid.add(topic)

    async def close(self) -> None:
        pass


def build(p: Params, ctx: ActionContext) -> RepublishAction:
    topic = Template(p.text("topic"), "topic")
    if topic.text.startswith("$") and not topic.text.startswith("${"):
        raise ValueError("topic: cannot republish into a $ topic")
    for bad in "+#":
        if bad in topic.text.replace("${", "").replace("}", ""):
            raise ValueError(f"topic: a topic name cannot hold the wildcard {bad!r}")
    qos_text = p.opt("qos")
    qos = None if qos_text is None else p.integer("qos", 0, 0, 2)
    return RepublishAction(ctx.republisher, topic, qos, p.flag("retain", False))
