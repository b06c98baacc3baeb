"""A publish the router refused at a tenant's cap (retained or delayed messages): counted
per tenant and cap, and told on the tenant's `quota_exceeded` event subject."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.aio.client import Client

from services.common.bus import subjects
from services.common.clock import now_ms
from services.common.refusals import Refusals
from starling.common.v1 import event_pb2

log = logging.getLogger("starling.router")


@dataclass(frozen=True, slots=True)
class QuotaEvents:
    """`refusals` counts what was refused (reported as metrics by the composition root);
    `nats` carries the events."""

    refusals: Refusals
    nats: Client

    async def exceeded(self, tenant: str, limit: str) -> None:
        """The tenant's publish was refused at `limit` (a cap's refusal label)."""
        self.refusals.count(limit, tenant)
        ev = event_pb2.Event(
            tenant=tenant,
            type=event_pb2.EVENT_TYPE_QUOTA_EXCEEDED,
            ts_ms=now_ms(),
            quota_exceeded=event_pb2.QuotaExceeded(limit=limit),
        )
        try:
            await self.nats.publish(
                subjects.event(tenant, "quota_exceeded"), ev.SerializeToString()
            )
        except Exception:  # events are best effort; the refusal itself is what matters
            log.warning("event_publish_failed")
