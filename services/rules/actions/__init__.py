"""Rule actions: `build_action(kind, params, ctx)` turns a rule's action spec (the proto's
string map) into an `Action` (started by its `Delivery`), and `build_source` does the same for
sources that feed the mesh (MQTT bridge in). Bad params raise ValueError naming the param."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from services.rules.actions.base import (
    Action,
    ActionContext,
    Output,
    PermanentActionError,
    Republisher,
    Source,
)
from services.rules.actions.params import Params

__all__ = [
    "KINDS",
    "SOURCE_KINDS",
    "Action",
    "ActionContext",
    "Output",
    "PermanentActionError",
    "Republisher",
    "Source",
    "build_action",
    "build_source",
]

# kind -> module holding `build(params, ctx)`; imported on use so an unused client library
# (aiokafka, aio-pika) costs nothing.
KINDS = {
    "republish": "services.rules.actions.republish",
    "http": "services.rules.actions.http",
    "mqtt_bridge": "services.rules.actions.mqtt_bridge",
    "nats": "services.rules.actions.nats_jetstream",
    "redis": "services.rules.actions.redis_streams",
    "rabbitmq": "services.rules.actions.rabbitmq",
    "kafka": "services.rules.actions.kafka",
}
SOURCE_KINDS = {"mqtt_bridge_in": "services.rules.actions.mqtt_bridge"}


def build_action(kind: str, params: Mapping[str, str], ctx: ActionContext) -> Action:
    """The action of `kind` configured by `params`; ValueError naming the bad param or kind."""
    module = KINDS.get(kind)
    if module is None:
        raise ValueError(f"kind: unknown action kind {kind!r} (one of {', '.join(KINDS)})")
    p = Params(kind, params)
    action: Action = importlib.import_module(module).build(p, ctx)
    p.done()
    return action


def build_source(kind: str, params: Mapping[str, str], ctx: ActionContext) -> Source:
    """A long-running source (`mqtt_bridge_in`) publishing into `ctx.tenant` through
    `ctx.republisher`; ValueError naming the bad param or kind."""
    module = SOURCE_KINDS.get(kind)
    if module is None:
        raise ValueError(f"kind: unknown source kind {kind!r} (one of {', '.join(SOURCE_KINDS)})")
    p = Params(kind, params)
    source: Source = importlib.import_module(module).build_source(p, ctx)
    p.done()
    return source
