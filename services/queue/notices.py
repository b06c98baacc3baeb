"""What the queue tells others after an append: a QueueNotice to the queue's readers (on the
reader's queue link, else on NATS), carrying the entries pushed to the lease's reader
(readers.py), and the depth limit's drops (a MessageDropped event, counted per tenant)."""

from __future__ import annotations

import logging

from nats.aio.client import Client

from services.common.bus import subjects
from services.common.clock import now_ms
from services.common.store.ports_queue import AppendOutcome, AppendReport, NewQueueItem
from services.queue.readers import Lease
from starling.common.v1 import event_pb2
from starling.queue.v1 import queue_pb2 as pb

log = logging.getLogger("starling.queue")


def _push(
    notice: pb.QueueNotice, reader: str, items: list[NewQueueItem], report: AppendReport
) -> None:
    """Put the entries this append stored (OK outcomes: consecutive seqs ending at last_seq)
    into `notice`, for `reader`."""
    stored = [it for it, o in zip(items, report.outcomes, strict=True) if o == AppendOutcome.OK]
    notice.reader = reader
    add = notice.entries.add
    for seq, it in enumerate(stored, start=report.last_seq - len(stored) + 1):
        # The stored form lacks exactly these fields (api.py `_new_item`): merged, not rebuilt.
        add(seq=seq, expires_at_ms=it.expires_at_ms).MergeFromString(it.data)


class Notices:
    """Announces appends; owns the count of entries the depth limit dropped per tenant since
    start (`dropped_by_tenant`, reported to metrics)."""

    def __init__(self, *, nats: Client) -> None:
        self._nats = nats
        self.dropped_by_tenant: dict[str, int] = {}

    async def announce(
        self,
        tenant: str,
        qid: str,
        report: AppendReport,
        pushed: list[NewQueueItem] | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Tell the queue's readers about new entries (a notice on NATS, carrying the
        `pushed` entries for the `lease`'s reader), and report drops."""
        if AppendOutcome.OK in report.outcomes:
            notice = pb.QueueNotice(tenant=tenant, queue_id=qid, last_seq=report.last_seq)
            link = None
            if pushed is not None and lease is not None:
                _push(notice, lease.reader, pushed, report)
                link = lease.link
            data = notice.SerializeToString()
            if link is None or not link.notice(data):
                await self._nats.publish(subjects.queue_notice(tenant, qid), data)
        if report.dropped:
            await self._dropped(tenant, qid, report.dropped)

    async def again(self, tenant: str, qid: str, dropped: bool = False) -> None:
        """A durable group's queue has entries to hand out again (a member gave its claims
        back, services/queue/groups.py): its members read; or, `dropped`, it is gone."""
        notice = pb.QueueNotice(tenant=tenant, queue_id=qid, dropped=dropped)
        await self._nats.publish(subjects.queue_notice(tenant, qid), notice.SerializeToString())

    async def _dropped(self, tenant: str, qid: str, count: int) -> None:
        """Depth limit hit: counted in the queue state and per tenant (the stats report),
        and an event on EVENTS."""
        self.dropped_by_tenant[tenant] = self.dropped_by_tenant.get(tenant, 0) + count
        log.warning("queue_depth_drop", extra={"tenant": tenant, "queue_id": qid, "count": count})
        ev = event_pb2.Event(
            tenant=tenant,
            type=event_pb2.EVENT_TYPE_MESSAGE_DROPPED,
            ts_ms=now_ms(),
            client_id=qid.rsplit("#", 1)[0],
            message_dropped=event_pb2.MessageDropped(reason="queue_depth_limit", count=count),
        )
        await self._nats.publish(subjects.event(tenant, "message_dropped"), ev.SerializeToString())
