"""Durable shared groups at the router: a group's queue is dropped with its last member.

A group's route (services/common/group_routes.py) follows its members' stored subscriptions;
when a change leaves a (group, filter) without members (an unsubscribe, or the end of the
last member's session: expiry or a clean start), its queue and whatever it holds go too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from services.common.group_routes import group_queue_id, split_shared
from services.common.route_table import RouteTable
from services.queue.client import QueueClient

log = logging.getLogger("starling.router.groups")


class GroupQueues:
    def __init__(self, *, table: RouteTable, queues: QueueClient) -> None:
        self._table = table
        self._queues = queues

    def shared_filters(self, tenant: str, client_id: str, incarnation: int) -> list[str]:
        """The session's `$share/...` filters (before its subscriptions are dropped)."""
        recs = self._table.subscriptions(tenant, client_id, incarnation)
        return [r.topic_filter for r in recs if split_shared(r.topic_filter) is not None]

    def durable(self, tenant: str, filters: Iterable[str]) -> list[bool]:
        """Whether each shared filter is a durable group's (a persistent member holds it)."""
        return [self._table.groups.members(tenant, f) > 0 for f in filters]

    async def drop_emptied(self, tenant: str, filters: Iterable[str]) -> None:
        """Drop the queue of every group among `filters` that has no member left."""
        for f in filters:
            key = split_shared(f)
            if key is None or self._table.groups.members(tenant, f):
                continue
            qid = group_queue_id(*key)
            try:
                await self._queues.drop(tenant, qid)
            except Exception as exc:  # its entries stay until compaction finds them
                log.warning("group_queue_drop_failed", extra={"queue_id": qid, "error": repr(exc)})
            else:
                log.info("group_queue_dropped", extra={"tenant": tenant, "queue_id": qid})
