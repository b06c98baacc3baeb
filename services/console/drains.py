"""The drains begun from the console, in Redis so every replica shows them: which node, who
asked, when, and what clients were told. The node does the draining and keeps its own state;
this record only lets the operations page show the progress of a drain begun earlier (and
"exited" once the node is gone) without asking the node to drain again: a page that only
looks never starts a drain.

Keys: `console:drain:<node name>`, kept for `keep_s` after the drain began."""

from __future__ import annotations

import json
from dataclasses import dataclass

from redis.asyncio import Redis

PREFIX = "console:drain:"


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainRecord:
    node: str
    started_at_ms: int
    by: str
    server_reference: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Drains:
    redis: Redis
    keep_s: int = 86400

    async def begun(self, record: DrainRecord) -> None:
        value = json.dumps(
            {
                "node": record.node,
                "at": record.started_at_ms,
                "by": record.by,
                "ref": record.server_reference,
            }
        )
        await self.redis.set(PREFIX + record.node, value, ex=self.keep_s)

    async def find(self, node: str) -> DrainRecord | None:
        raw = await self.redis.get(PREFIX + node)
        if raw is None:
            return None
        d = json.loads(raw)
        return DrainRecord(
            node=d["node"], started_at_ms=int(d["at"]), by=d["by"], server_reference=d["ref"]
        )

    async def forget(self, node: str) -> None:
        """The node serves again (restarted): its old drain is over."""
        await self.redis.delete(PREFIX + node)
