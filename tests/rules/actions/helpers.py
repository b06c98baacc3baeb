"""Shared pieces of the action tests: outputs, a recording republisher, polling."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.rules.actions.base import Output, Republished


def output(
    i: int = 0,
    columns: dict[str, Any] | None = None,
    topic: str = "sensors/a/temp",
    tenant: str = "t1",
    rule_id: str = "r1",
    qos: int = 1,
    clientid: str = "dev-1",
) -> Output:
    cols = {"t": 30 + i, "i": i} if columns is None else columns
    return Output(
        tenant=tenant,
        rule_id=rule_id,
        topic=topic,
        columns=cols,
        payload=json.dumps(cols, default=str).encode(),
        qos=qos,
        message_id=f"m{i}",
        published_at_ms=1_700_000_000_000 + i,
        user_properties=(("k", "v"),),
        clientid=clientid,
    )


@dataclass
class Published:
    tenant: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    user_properties: tuple[tuple[str, str], ...]


@dataclass
class RecordingRepublisher:
    """What the rules service's republisher received (part A's real one publishes into the
    mesh; its mesh-level tests cover that path)."""

    published: list[Published] = field(default_factory=list)

    async def publish(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        user_properties: tuple[tuple[str, str], ...],
    ) -> None:
        self.published.append(Published(tenant, topic, payload, qos, retain, user_properties))

    async def publish_many(self, messages: Sequence[Republished]) -> None:
        for m in messages:
            await self.publish(*m)
