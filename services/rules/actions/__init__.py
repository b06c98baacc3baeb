"""Rule actions: `build_action(kind, params, ctx)` turns a rule's action spec (the proto's
string map) into a started-on-demand `Action`; bad params raise ValueError naming the param."""

from __future__ import annotations

from collections.abc import Mapping

from services.rules.actions.base import Action, ActionContext, Output, Republisher

__all__ = ["KINDS", "Action", "ActionContext", "Output", "Republisher", "build_action"]

KINDS = ("republish", "http", "mqtt_bridge", "nats", "redis", "rabbitmq", "kafka")


def build_action(kind: str, params: Mapping[str, str], ctx: ActionContext) -> Action:
    """The action of `kind` configured by `params`; ValueError naming the bad param or kind."""
    raise ValueError(f"kind: unknown action kind {kind!r} (one of {', '.join(KINDS)})")
