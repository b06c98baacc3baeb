"""Delivery of a persistent session's queue to its connection.

Invariants:
- A persistent session takes QoS>=1 deliveries only from its queue, never from the
  transient fan-out, so nothing arrives twice.
- The packet id of an entry is derived from its seq (`pid_for`), so a resend after a reconnect
  (DUP) and a PUBREL for an entry the client already PUBREC'd use the id the client knows
  [MQTT-4.4.0-1]. Ids are taken against the session's whole in-flight set: an entry whose id
  is still in flight (an entry 65535 seqs older, or a shared delivery) waits, with everything
  after it, until that id is free; it is never skipped.
- PUBREL goes out only after the queue holds the entry as released, durably: a client that
  got PUBREL has forgotten the message, so a later connection must resend PUBREL, never the
  PUBLISH. A PUBCOMP'd entry not yet acked is therefore resent as PUBREL, which is harmless.
- PUBRELs go out in the order their PUBRECs came [MQTT-4.6.0-3] (release_order.py).
- The queue is acked through the highest seq below which every delivered entry is complete
  (PUBACK, PUBCOMP, or expired/too large); acks are batched (queue_acks.py).
- DUP is set on the entries an earlier read may have handed to a connection, and only on
  those: every read marks its entries delivered (durably, before answering) and returns the
  mark from before it: seq <= that mark is DUP=1, a higher seq DUP=0 [MQTT-3.3.1-1].
- While the outbound bandwidth budget is spent (Outbound.gate) the window reads 0: nothing
  is read. A read batch stops at the first entry the budget does not admit (read again later).
- The session's durable shared groups are delivered beside its queue (group_delivery.py).
- Entries pushed in a queue notice (the queue does so while this delivery, its `reader`, is
  caught up; services/queue/readers.py) were marked delivered by the append itself. They are
  sent straight from the notice, DUP=0, from `next_read` on, only when the notice holds
  `next_read` and the window takes the rest; otherwise they are read back like any entry,
  and the queue reports the mark from before its pushes to this reader, so they still go
  out DUP=0 (this delivery never reads back what it sent). A notice that comes while a read
  is under way waits for it (at most STASH_MAX, no more entries than the reader's credit):
  sent after the read's entries, it spares the read that would otherwise follow, which at
  a steady rate kept reads going back to back (each notice came during the previous read).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.tasks import TaskSet
from services.connection.channel import Channel
from services.connection.group_delivery import GroupDeliveries
from services.connection.queue_acks import QueueAcks, Room
from services.connection.queue_notices import QueueNotices
from services.connection.queue_poll import QueuePoll
from services.connection.queue_trace import deliver_traced
from services.connection.release_order import ReleaseOrder
from services.queue.client import Notice, QueueClient, QueueEntry, QueueRead, parse_notice

log = logging.getLogger("starling.connection.persistence")

READ_BATCH = 100  # entries per read: what a client that stopped reading pulls into memory
# Notices of pushed entries kept while a read is under way (each holds at most the reader's
# credit, one read's room; services/queue/readers.py): past it they are read back.
STASH_MAX = 16


def pid_for(seq: int) -> int:
    return seq % 65535 + 1


@dataclass(frozen=True, slots=True)
class DeliveryDeps:
    """What every persistent delivery of a node uses: the queue service, NATS (the queue's
    notices) and the clock for expiry checks."""

    queue: QueueClient
    nc: Client
    now: Callable[[], float]


class PersistentDelivery:
    def __init__(
        self,
        *,
        channel: Channel,
        deps: DeliveryDeps,
        tenant: str,
        queue_id: str,
        wrote: Callable[[], None],
        wake: Callable[[float], None],
    ) -> None:
        """`wrote()`: the channel has bytes to send; `wake(at)`: call `poll_if_due` at `at`."""
        self.channel = channel
        # Every PUBACK/PUBCOMP/PUBREC is reported (DeliveryProgress) so the queue is acked:
        # set before anything can be delivered on this channel.
        channel.outbound.track_completions()
        self.wrote = wrote
        self.queue = deps.queue
        self.tenant = tenant
        self.queue_id = queue_id
        self.now = deps.now
        self.next_read = 0  # 0: start after the queue's acked_through
        self.by_pid: dict[int, int] = {}  # packet id -> seq, delivered and not complete
        self.read_through = 0  # highest seq read
        # The queue's delivered mark at this connection's first read (None until then):
        # entries above it went, if at all, to this connection, which never reads back what
        # it sent, so one read again (packet id busy, budget spent, push not taken) is DUP=0.
        self.dup_through: int | None = None
        self.more = True
        # Bumped by every notice not taken as pushed; a read only clears `more` if unchanged.
        self._notices = 0
        # Notices of pushed entries that came while a read was under way (STASH_MAX).
        self._stash: list[Notice] = []
        self.announced = 0  # highest seq a notice reported
        self.reader = uuid.uuid4().hex  # names this delivery to the queue (pushes go to it)
        self.closed = False
        # No read before `start` has subscribed to the notices: a transport that drains
        # (Conn.writable) or the sweeper's poll may call `pump` first.
        self._started = False
        self._reading = False
        self._blocked_on = 0  # packet id in flight that the next entry to deliver needs
        self._build_parts(deps.nc, queue_id, wrote, wake)
        self.groups = GroupDeliveries(  # the durable shared groups it is a member of
            channel=channel, queue=deps.queue, nc=deps.nc, tenant=tenant, now=deps.now,
            wrote=wrote, taken=self.by_pid,
        )  # fmt: skip

    def _build_parts(
        self, nc: Client, queue_id: str, wrote: Callable[[], None], wake: Callable[[float], None]
    ) -> None:
        """What this delivery drives: its tasks, the notices it hears, the queue's acks, the
        PUBRELs' order, and the poll that stands in for a notice that never came."""
        queue, tenant = self.queue, self.tenant
        self._listening = QueueNotices(
            queue=queue,
            nc=nc,
            subject=subjects.queue_notice(tenant, queue_id),
            reader=self.reader,
            on_link=self._notice,
            on_nats=self._on_notice,
        )
        self._tasks = tasks = TaskSet()
        self._acks = QueueAcks(
            queue=queue,
            tenant=tenant,
            queue_id=queue_id,
            tasks=tasks,
            through=self._ack_through,
            room=self._room,
        )
        self._releases = ReleaseOrder(
            queue=queue,
            tenant=tenant,
            queue_id=queue_id,
            channel=self.channel,
            wrote=wrote,
            tasks=tasks,
        )
        self._poll = QueuePoll(queue.generation, wake)  # the safety net (`poll_if_due`)

    async def start(self) -> None:
        if self.closed:  # the connection ended before its turn came
            return
        await self._listening.start()
        self._started = True
        self._poll.started(self.now())  # this first read is also the first poll
        self.pump()
        self.groups.start()

    async def _on_notice(self, msg: Msg) -> None:
        self._notice(parse_notice(msg.data))

    def _notice(self, notice: Notice) -> None:
        self._poll.hear()
        self.announced = max(self.announced, notice.last_seq)
        if notice.pushed and notice.reader == self.reader and not self.closed:
            if self._reading and len(self._stash) < STASH_MAX:
                self._stash.append(notice)  # sent from here once the read is back
                return
            if not self._reading and self._take_pushed(notice) >= 0:
                return
        self._notices += 1
        self.more = True
        self.pump()

    def _take_pushed(self, notice: Notice) -> int:
        """Send the entries the queue pushed to this reader from `next_read` on, if the
        notice holds `next_read` and the rest fits the window now. Returns -1 when nothing
        was taken (the entries are read back instead), else the seq of the first entry that
        waits for its packet id or the budget (0: all sent)."""
        first, last = notice.first_seq, notice.first_seq + notice.pushed - 1
        start = self.next_read  # (0 until the first read: nothing taken before it)
        if self.closed or not first <= start <= last:
            return -1
        ob = self.channel.outbound
        if ob.congested or ob.free_window < last - start + 1:
            return -1
        self.next_read = last + 1
        # Entries before `start` came in a read. The rest were pushed to this reader only, and
        # it never sent them: DUP=0.
        stopped = self._deliver(notice.entries()[start - first :], start - 1)
        if stopped:  # the rest is read back once the budget (or packet id) allows
            self.next_read = stopped
            last = stopped - 1
            self.more = True
        self.read_through = max(self.read_through, last)
        self._acks.schedule()
        return stopped

    def _take_stash(self) -> bool:
        """A read is back: send what the queue pushed meanwhile (the notices that came
        during the read), so that those entries need no read of their own. False when an
        entry waits for its packet id or the budget (read again from there later); a
        notice that cannot be taken (a gap before it, no room) counts as an announcement
        that makes the loop read on."""
        stash, self._stash = self._stash, []
        for notice in stash:
            if notice.first_seq + notice.pushed <= self.next_read:
                continue  # the read brought them all
            stopped = self._take_pushed(notice)
            if stopped < 0:
                self._notices += 1
                return True
            if stopped:
                return False
        return True

    def pump(self) -> None:
        """Read more if the client's window has room and the queue may have entries."""
        if self.closed or self._reading or not self.more or not self._started:
            return
        ob = self.channel.outbound
        if self._blocked_on:
            if self._blocked_on in ob.inflight or self._blocked_on in self.by_pid:
                return  # the next entry's packet id is still taken
            self._blocked_on = 0
        if ob.free_window <= 0 or ob.congested:
            return  # the entries wait in the queue, not in this node's memory
        self._reading = True
        self._tasks.spawn(self._read())

    async def _read(self) -> None:
        try:
            while not self.closed and self.more:
                ob = self.channel.outbound
                window = ob.free_window
                if window <= 0 or ob.congested:
                    return
                from_seq = self.next_read or 1
                notices = self._notices
                resp = await self._fetch(from_seq, min(window, READ_BATCH))
                if resp is None or self.closed:
                    return  # an ended connection sends nothing and acks nothing
                if not self._took(resp, from_seq, notices):
                    return
        finally:
            self._reading = False
            if self._stash:  # not taken: those entries are read back
                self._stash.clear()
                self.more = True
            self._acks.schedule()

    async def _fetch(self, from_seq: int, count: int) -> QueueRead | None:
        """Read (and mark delivered) up to `count` entries from `from_seq`; None when the
        queue service did not answer (the poll retries soon)."""
        try:
            return await self.queue.read(
                self.tenant, self.queue_id, from_seq, count, mark_delivered=True, reader=self.reader
            )
        except Exception as exc:  # queue service down: the poll retries
            self._poll.hear()  # the next poll comes soon
            log.warning("queue_read_failed", extra={"error": type(exc).__name__})
            return None

    def _took(self, resp: QueueRead, from_seq: int, notices: int) -> bool:
        """Send what a read from `from_seq` brought (`notices`: the count when it began);
        True to read on."""
        if self.next_read == 0:
            self._acks.start_at(resp.acked_through)
            self.read_through = resp.acked_through
        if self.dup_through is None:
            self.dup_through = resp.delivered_through
        if resp.last_seq < from_seq:  # nothing left to scan, for now
            if not self._take_stash():
                return False
            self.more = self._notices != notices  # entries announced meanwhile: read on
            return self.more
        self._poll.hear()
        stopped = self._deliver(resp.entries, min(resp.delivered_through, self.dup_through))
        # Stopped: read again from there once its packet id is free.
        self.next_read = stopped or resp.last_seq + 1
        self.read_through = max(self.read_through, self.next_read - 1)
        return not stopped and self._take_stash()

    def _deliver(self, entries: Sequence[QueueEntry], delivered_before: int) -> int:
        """Send `entries`; those at or below `delivered_before` (the queue's delivered mark
        before this read) may have reached an earlier connection: DUP=1. Returns the seq of
        the first entry whose packet id is still in flight (0: all sent): it and the rest wait."""
        ob = self.channel.outbound
        now = self.now()
        stopped = 0
        settled = False  # entries done without an ack to wait for
        for e in entries:
            pid = pid_for(e.seq)
            if pid in self.by_pid or pid in ob.inflight:
                self._blocked_on = pid
                stopped = e.seq
                break
            self.by_pid[pid] = e.seq
            if e.released:
                ob.resend_pubrel(pid)
                continue
            msg = e.message
            if msg.qos == 0:  # e.g. a retained QoS 0 message for this session
                ob.deliver(msg, 0, msg.retain, e.subscription_ids, now)
                ob.settled(pid)
                settled = True
                continue
            if not ob.may_send(msg):  # the bandwidth budget is spent: read it again later
                del self.by_pid[pid]
                stopped = e.seq
                break
            dup = e.seq <= delivered_before
            if msg.trace_context:  # sampled where it was published: this is its last hop
                sent = deliver_traced(
                    ob, e, pid, dup, now, client_id=self.channel.client_id, queue_id=self.queue_id
                )
            else:
                sent = ob.deliver_stored(
                    msg, msg.qos, msg.retain, e.subscription_ids, pid, dup, now
                )
            if not sent:  # expired or too large: done without sending
                ob.settled(pid)
                settled = True
        if settled:
            # Settled without an ack to wait for: no PUBACK will report them, so the queue
            # is acked past them now (else a too-large entry would hold back every ack).
            self.progress()
        if self.channel.out:
            self.wrote()
        return stopped

    def progress(self) -> None:
        """The channel recorded PUBACK/PUBCOMP/PUBREC: ack the queue, read more."""
        completed, released = self.channel.outbound.take_progress()
        if self.groups.by_pid:  # the groups' deliveries are acked to their own queues
            self.groups.progress(completed, released)
        if released:
            by_pid = self.by_pid
            self._releases.add((pid, by_pid[pid]) for pid in released if pid in by_pid)
        if completed:
            for pid in completed:
                self.by_pid.pop(pid, None)
            self._acks.schedule()
            if self._blocked_on:
                self.more = True  # the packet id an entry waits for may be free now
        if self.next_read and self.next_read <= self.announced:
            self.more = True  # entries were announced beyond what has been read
        self.pump()

    def _room(self) -> Room | None:
        """What the ack tells the queue to renew this reader's push credit with: the
        entries the window takes now beyond the highest seq received. None unless this
        delivery is caught up: a Read under way sets the credit with its answer, and one
        that is due (entries announced, or one waiting for its packet id) will."""
        if self._reading or self._stash or self.more or self._blocked_on or self.closed:
            return None
        ob = self.channel.outbound
        room = 0 if ob.congested else min(ob.free_window, READ_BATCH)
        return (self.reader, room, self.read_through)

    def _ack_through(self) -> int:
        if self.by_pid:
            return min(self.by_pid.values()) - 1
        return self.read_through

    async def close(self) -> None:
        """Connection gone: flush the last ack, stop listening."""
        if self.closed:
            return
        self.closed = True
        self._acks.stop()
        self._releases.stop()
        await self._listening.stop()
        await self._acks.final(self.reader)
        await self.groups.close()

    def poll(self) -> None:
        """Read now: whatever the queue holds beyond what was read goes out."""
        self.more = True
        self.pump()
        self.groups.poll()

    @property
    def next_poll(self) -> float:
        """When `poll_if_due` next reads, unless the queue client's generation moves first."""
        return self._poll.next_at

    def poll_if_due(self, now: float) -> None:
        """The safety net for a notice that never came (queue_poll.py), called by the
        sweeper at `next_poll` and when the queue client's generation moved."""
        if self._poll.due(now, self.queue.generation):
            self.poll()
