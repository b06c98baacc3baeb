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
- PUBRELs go out in the order their PUBRECs came [MQTT-4.6.0-3], whatever order their marks
  become durable in: a subscriber hands a QoS 2 message to its application on PUBREL, so a
  PUBREL that overtook an earlier one would deliver the messages out of order. One task
  writes the marks; a mark that failed holds back the PUBRELs behind it until its retry.
- The queue is acked through the highest seq below which every delivered entry is complete
  (PUBACK, PUBCOMP, or expired/too large); acks are batched.
- DUP is set on the entries an earlier read may have handed to a connection, and only on
  those: every read marks its entries delivered in the queue (durably, before answering) and
  returns the mark from before it, so seq <= that mark means "maybe sent before" (DUP=1) and
  a higher seq is a first attempt (DUP=0) [MQTT-3.3.1-1]. A connection that dies between
  the mark and the write errs towards DUP=1, never the reverse.
- While the outbound bandwidth budget is spent (Outbound.gate) the window reads 0: nothing
  is read, entries stay in the queue. A read batch stops at the first entry the budget does
  not admit; it is read again (DUP=1, as for an entry whose packet id was taken) once the
  gate wakes the connection.
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

import asyncio
import itertools
import logging
import random
import uuid
from collections import deque
from collections.abc import Callable, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from services.common.bus import subjects
from services.common.tasks import TaskSet
from services.common.telemetry import TENANT_ATTRIBUTE, extract
from services.connection.channel import Channel
from services.queue.client import Notice, QueueClient, QueueEntry, parse_notice

log = logging.getLogger("starling.connection.persistence")
tracer = trace.get_tracer("starling.connection")

ACK_EVERY = 64
# Entries per queue read: with the congestion check between reads, what one client that
# stopped reading can pull into memory is one batch.
READ_BATCH = 100
ACK_DELAY_S = 0.02
# Notices of pushed entries kept while a read is under way (each holds at most the reader's
# credit, one read's room; services/queue/readers.py): past it they are read back.
STASH_MAX = 16
# Retry of a released mark the queue could not write: the PUBREL waits for it.
RELEASE_RETRY_S = 0.2
# The safety-net poll of a session's queue (`poll_if_due`): every POLL_MIN_S while anything
# happens, doubling to POLL_MAX_S while nothing does.
POLL_MIN_S = 1.0
POLL_MAX_S = 16.0


def pid_for(seq: int) -> int:
    return seq % 65535 + 1


class PersistentDelivery:
    def __init__(
        self,
        channel: Channel,
        queue: QueueClient,
        nc: Client,
        tenant: str,
        queue_id: str,
        now: Callable[[], float],
        wrote: Callable[[], None],
        wake: Callable[[float], None],
    ) -> None:
        self.channel = channel
        # Every PUBACK/PUBCOMP/PUBREC is reported (DeliveryProgress) so the queue is acked:
        # set before anything can be delivered on this channel.
        channel.outbound.track_completions = True
        self.wrote = wrote  # the channel has bytes to send
        self._wake = wake  # the sweeper: call `poll_if_due` at the first tick after this time
        self.queue = queue
        self.nc = nc
        self.tenant = tenant
        self.queue_id = queue_id
        self.now = now  # clock for expiry checks
        self.next_read = 0  # 0: start after the queue's acked_through
        self.by_pid: dict[int, int] = {}  # packet id -> seq, delivered and not complete
        self.read_through = 0  # highest seq read
        self.acked = 0
        # The queue's delivered mark at this connection's first read: what earlier
        # connections of the session may have received. Every entry above it was handed, if
        # at all, to this connection, which never reads back what it sent: an entry above it
        # that is read again (its packet id was busy, the bandwidth budget was spent, a
        # pushed entry was not taken) is still a first attempt, DUP=0, whatever the queue's
        # mark says by then. None until the first read answers.
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
        self._ack_task: asyncio.Task[None] | None = None
        # (packet id, seq) whose PUBREC came and whose PUBREL has not gone out, in PUBREC order.
        self._to_release: deque[tuple[int, int]] = deque()
        self._releasing = False  # the task that marks them and sends their PUBRELs runs
        self._tasks = TaskSet()
        self._sub: NatsSubscription | None = None
        # The safety-net poll (`poll_if_due`).
        self._poll_every = POLL_MIN_S
        self._poll_at = 0.0
        self._polled_at = 0.0
        self._polled_generation = queue.generation
        self._heard = True  # something happened since the last poll: poll again soon

    async def start(self) -> None:
        if self.closed:  # the connection ended before its turn came
            return
        # Notices come on NATS, and those that push entries to this reader on the queue
        # link when its reads and acks go that way (services/queue/link.py).
        self.queue.listen(self.reader, self._notice)
        self._sub = await self.nc.subscribe(
            subjects.queue_notice(self.tenant, self.queue_id), cb=self._on_notice
        )
        self._started = True
        # This first read is also the first poll: the safety net's next one is a second
        # later (a reconnect storm of N sessions read each queue twice at once otherwise).
        self._polled_at = self.now()
        self._poll_at = self._polled_at + POLL_MIN_S
        self._wake(self._poll_at)
        self.pump()

    async def _on_notice(self, msg: Msg) -> None:
        self._notice(parse_notice(msg.data))

    def _notice(self, notice: Notice) -> None:
        self._hear()
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
        self._schedule_ack()
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
                try:
                    resp = await self.queue.read(
                        self.tenant,
                        self.queue_id,
                        from_seq,
                        min(window, READ_BATCH),
                        mark_delivered=True,
                        reader=self.reader,
                    )
                except Exception as exc:  # queue service down: the poll retries
                    self._hear()  # the next poll comes soon
                    log.warning("queue_read_failed", extra={"error": type(exc).__name__})
                    return
                if self.closed:
                    return  # the connection ended during the read: nothing goes out, nothing acks
                if self.next_read == 0:
                    self.acked = resp.acked_through
                    self.read_through = resp.acked_through
                if self.dup_through is None:
                    self.dup_through = resp.delivered_through
                if resp.last_seq < from_seq:  # nothing left to scan, for now
                    if not self._take_stash():
                        return
                    if self._notices == notices:  # no new entries announced meanwhile
                        self.more = False
                        return
                    continue
                self._hear()
                stopped = self._deliver(resp.entries, min(resp.delivered_through, self.dup_through))
                if stopped:  # read again from there once its packet id is free
                    self.next_read = stopped
                    self.read_through = max(self.read_through, stopped - 1)
                    return
                self.next_read = resp.last_seq + 1
                self.read_through = max(self.read_through, resp.last_seq)
                if not self._take_stash():
                    return
        finally:
            self._reading = False
            if self._stash:  # not taken: those entries are read back
                self._stash.clear()
                self.more = True
            self._schedule_ack()

    def _deliver(self, entries: Sequence[QueueEntry], delivered_before: int) -> int:
        """Send `entries`; those at or below `delivered_before` (the queue's delivered mark
        before this read) may have reached an earlier connection: DUP=1. Returns the seq of
        the first entry whose packet id is still in flight (0: all sent): it and the rest wait."""
        ob = self.channel.outbound
        now = self.now()
        stopped = 0
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
                ob.completed.append(pid)
                continue
            if not ob.may_send(msg):  # the bandwidth budget is spent: read it again later
                del self.by_pid[pid]
                stopped = e.seq
                break
            dup = e.seq <= delivered_before
            if msg.trace_context:  # sampled where it was published: this is its last hop
                self._deliver_traced(e, pid, dup, now)
            elif not ob.deliver_stored(msg, msg.qos, msg.retain, e.subscription_ids, pid, dup, now):
                ob.completed.append(pid)  # expired or too large: done without sending
        if ob.completed:
            # Settled without an ack to wait for: no PUBACK will report them, so the queue
            # is acked past them now (else a too-large entry would hold back every ack).
            self.progress()
        if self.channel.out:
            self.wrote()
        return stopped

    def _deliver_traced(self, e: QueueEntry, pid: int, dup: bool, now: float) -> None:
        msg, ob = e.message, self.channel.outbound
        with tracer.start_as_current_span(
            "mqtt.deliver",
            context=extract(dict(msg.trace_context)),
            kind=SpanKind.CONSUMER,
            attributes={
                "mqtt.topic": msg.topic,
                TENANT_ATTRIBUTE: msg.tenant,
                "mqtt.client_id": self.channel.client_id,
                "starling.queue": self.queue_id,
                "starling.seq": e.seq,
                "mqtt.dup": dup,
            },
        ) as span:
            if not ob.deliver_stored(msg, msg.qos, msg.retain, e.subscription_ids, pid, dup, now):
                ob.completed.append(pid)  # expired or too large: done without sending
                span.set_attribute("starling.sent", False)

    def progress(self) -> None:
        """The channel recorded PUBACK/PUBCOMP/PUBREC: ack the queue, read more."""
        ob = self.channel.outbound
        if ob.released:
            by_pid = self.by_pid
            self._to_release.extend((pid, by_pid[pid]) for pid in ob.released if pid in by_pid)
            ob.released.clear()
            if self._to_release and not self._releasing:
                self._releasing = True
                self._tasks.spawn(self._release(), name="queue-mark-released")
        if ob.completed:
            for pid in ob.completed:
                self.by_pid.pop(pid, None)
            ob.completed.clear()
            self._schedule_ack()
            if self._blocked_on:
                self.more = True  # the packet id an entry waits for may be free now
        if self.next_read and self.next_read <= self.announced:
            self.more = True  # entries were announced beyond what has been read
        self.pump()

    def _room(self) -> tuple[str, int, int] | None:
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

    def _schedule_ack(self) -> None:
        if self.closed or self._ack_task is not None:
            return
        through = self._ack_through()
        if through <= self.acked:
            return
        delay = 0.0 if through - self.acked >= ACK_EVERY else ACK_DELAY_S
        self._ack_task = self._tasks.spawn(self._ack_later(delay), name="queue-ack")

    async def _ack_later(self, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            through = self._ack_through()
            if through > self.acked:
                await self.queue.ack(self.tenant, self.queue_id, through, renew=self._room())
                self.acked = through
        except Exception as exc:  # retried with the next progress
            log.warning("queue_ack_failed", extra={"error": type(exc).__name__})
        finally:
            self._ack_task = None

    async def _release(self) -> None:
        """Mark the entries of `_to_release` released in the queue (those that came while the
        previous call was under way in the next one), then send their PUBRELs in PUBREC order.
        A failed call is retried while the connection lasts, and the PUBRELs wait; if the
        connection ends first, the next one resends the PUBLISH (DUP), which the client, still
        holding the id from its PUBREC, answers without delivering twice."""
        try:
            while self._to_release and not self.closed:
                batch = len(self._to_release)
                seqs = [seq for _, seq in itertools.islice(self._to_release, batch)]
                try:
                    await self.queue.mark_released(self.tenant, self.queue_id, seqs)
                except Exception as exc:
                    log.warning(
                        "queue_mark_released_failed",
                        extra={"entries": batch, "error": type(exc).__name__},
                    )
                    await asyncio.sleep(RELEASE_RETRY_S)
                    continue
                if self.closed:
                    return
                ob = self.channel.outbound
                for _ in range(batch):
                    ob.send_pubrel(self._to_release.popleft()[0])
                if self.channel.out:
                    self.wrote()
        finally:
            self._releasing = False

    async def close(self) -> None:
        """Connection gone: flush the last ack, stop listening."""
        if self.closed:
            return
        self.closed = True
        self.queue.unlisten(self.reader)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # the NATS connection may be closing too
                log.debug("notice_unsubscribe_failed")
        through = self._ack_through()
        try:  # also tells the queue to push nothing more to this reader
            await self.queue.ack(
                self.tenant,
                self.queue_id,
                through if through > self.acked else 0,
                detach_reader=self.reader,
            )
        except Exception as exc:
            log.warning("queue_final_ack_failed", extra={"error": type(exc).__name__})

    def poll(self) -> None:
        """Read now: whatever the queue holds beyond what was read goes out."""
        self.more = True
        self.pump()

    @property
    def next_poll(self) -> float:
        """When `poll_if_due` next reads, unless the queue client's generation moves first."""
        if self._heard:
            return min(self._poll_at, self._polled_at + POLL_MIN_S)
        return self._poll_at

    def _hear(self) -> None:
        """Something happened (a notice, entries, a failed read): poll again soon."""
        if not self._heard:
            self._heard = True
            if self._polled_at + POLL_MIN_S < self._poll_at:
                self._wake(self._polled_at + POLL_MIN_S)

    def poll_if_due(self, now: float) -> None:
        """The safety net for a notice that never came, called by the sweeper at `next_poll`
        (`wake` says when that moved earlier) and when the queue client's generation moved.
        A read per connected session per second cost the queue service a quarter of a core
        for 5,000 idle sessions, so the interval doubles after each poll with nothing heard
        (no notice, no entry, no failed read) up to POLL_MAX_S; anything heard brings the
        next poll within POLL_MIN_S and the interval back to it. When the `generation` moves
        (a queue link opened or broke, a partition changed owner, NATS reconnected: the
        times notices get lost) it polls at once. A notice lost otherwise (e.g. dropped by a
        slow subscription) waits at most POLL_MAX_S. Jitter keeps sessions that connected
        together from polling together."""
        generation = self.queue.generation
        moved = generation != self._polled_generation
        if not moved and now < self.next_poll:
            return
        if moved or self._heard:
            self._poll_every = POLL_MIN_S
        else:
            self._poll_every = min(self._poll_every * 2, POLL_MAX_S)
        self._polled_generation = generation
        self._heard = False
        self._polled_at = now
        self._poll_at = now + self._poll_every * random.uniform(0.8, 1.2)
        self.poll()
