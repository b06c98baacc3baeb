"""Delivery of durable shared groups' queues to one member's connection.

A persistent session's `$share/<group>/<filter>` subscription (QoS >= 1) takes its QoS >= 1
messages from the group's queue (services/common/group_routes.py), which the queue's owner
hands out to the members that ask (services/queue/groups.py). This module is the asking side,
one per persistent connection (persistence.py owns it):

- A read claims at most what the client's window has room for: a member that does not
  acknowledge claims nothing more, so the others take the group's traffic (flow control).
  An entry claimed while the window filled meanwhile waits here (`held`), already its own.
- Each entry goes out under a packet id free in the whole session (not in flight, not a
  session-queue entry's); its PUBACK, PUBCOMP (or PUBREC: the client has the message, the
  PUBREL follows at once) acknowledges that entry alone to the group's queue.
- Leaving (unsubscribe, connection end) detaches: what this member claimed and did not
  acknowledge goes to another member. A node that dies detaches nobody: the owner gives
  the claims back once the member has been silent for its TTL; polls (`poll`) renew it.
- The group's notices (`qn.<tenant>.<queue_id>`, NATS) say there are entries to claim.

Clean-session members of a durable group (a group with persistent members too) take its
QoS >= 1 messages from its queue as well, or one message would reach the group twice (once
from NATS, once from the queue): group_members.py keeps one of these per such connection, in
`scan` mode (a clean session reports no completions: a packet id that left the in-flight set
is done). A clean member claims only while the group is durable (`active`): as the router
said when it joined, from the group's first notice on, and until the queue's drop notice; the
node's NATS dispatch skips the group's QoS >= 1 messages while it is (`SharedGroup.durable`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.common.bus import subjects
from services.common.tasks import TaskSet
from services.connection.channel import Channel
from services.connection.subscriptions import SharedGroup
from services.queue.client import QueueClient, QueueEntry, parse_notice

log = logging.getLogger("starling.connection.group_delivery")

# Entries per claim, at most: members claim in turns, so a member whose client takes
# thousands in flight cannot take a whole burst while the others wait.
CLAIM_BATCH = 16
SCAN_S = 0.02  # `scan` mode: how often the in-flight set is looked at for completions
ACK_DELAY_S = 0.005  # acks wait this long for others to go in the same call
ACK_TRIES, ACK_RETRY_S = 10, 0.5  # a failed ack is sent again (an owner moving: ~1-3 s)
# `scan` mode: while it holds claims, a clean member tells the owners it lives this often
# (services/queue/groups.py MEMBER_TTL_S).
RENEW_S = 20.0


@dataclass(slots=True)
class GroupRead:
    """One durable group this member belongs to."""

    queue_id: str
    qos: int  # the member's subscription QoS
    sub_ids: tuple[int, ...]
    more: bool = True  # the queue may have entries to claim
    heard: int = 0  # notices heard: a claim that found nothing clears `more` only if unchanged
    reading: bool = False
    dup_through: int = 0  # entries at or below it may have gone out before: DUP=1
    notices: Subscription | None = None
    held: deque[QueueEntry] = field(default_factory=deque)  # claimed, waiting for the window
    shared: SharedGroup[Any] | None = None  # the node's view of the group (its `durable`)
    active: bool = True  # the group is durable: claim (a clean member: see the docstring)

    def durable(self, on: bool) -> None:
        self.active = on
        if self.shared is not None:
            self.shared.durable = on


class GroupDeliveries:
    def __init__(
        self,
        *,
        channel: Channel,
        queue: QueueClient,
        nc: object,
        tenant: str,
        now: Callable[[], float],
        wrote: Callable[[], None],
        taken: Container[int],
        scan: bool = False,
    ) -> None:
        """`taken`: packet ids the session's own queue delivery holds (persistence.py);
        `scan`: a clean session's (completions found in the in-flight set)."""
        self._channel = channel
        self._queue = queue
        self._nc = nc
        self._tenant = tenant
        self._now = now
        self._wrote = wrote
        self._taken = taken
        self.member = uuid.uuid4().hex  # names this connection to the groups' owners
        self.groups: dict[str, GroupRead] = {}
        self.by_pid: dict[int, tuple[str, int]] = {}  # packet id -> (queue id, seq)
        self._acks: dict[str, list[int]] = {}
        self._acking = False
        self._next_pid = 0
        self._started = False
        self._closed = False
        self._tasks = TaskSet()
        self._scan = scan
        self._scanning = False

    # ---- membership ----------------------------------------------------------------------

    def join(
        self,
        queue_id: str,
        qos: int,
        sub_ids: tuple[int, ...],
        shared: SharedGroup[Any] | None = None,
        active: bool = True,
    ) -> None:
        """Read `queue_id` for this member (`active`: the group is durable now)."""
        if self._closed or queue_id in self.groups:
            return
        g = self.groups[queue_id] = GroupRead(queue_id, qos, sub_ids, shared=shared)
        if active:  # (never undone here: another member of this node may know better)
            g.durable(True)
        else:
            g.active = False
        self._tasks.spawn(self._listen(g), name="group-notices")

    async def _listen(self, g: GroupRead) -> None:
        async def on_notice(msg: Msg) -> None:
            if parse_notice(msg.data).dropped:
                if g.active:
                    g.durable(False)  # back to NATS; nothing left to give back
                    self._tasks.spawn(self._give_back(g, tell=False), name="group-detach")
                return
            if not g.active:
                g.durable(True)
            g.more = True
            g.heard += 1
            self.pump()

        subject = subjects.queue_notice(self._tenant, g.queue_id)
        try:
            g.notices = await self._nc.subscribe(subject, cb=on_notice)  # type: ignore[attr-defined]
        except Exception as exc:  # the polls stand in for the notices
            log.warning("group_notices_failed", extra={"error": repr(exc)})
        if g.queue_id not in self.groups:  # left meanwhile
            await self._unlisten(g)
            return
        self.pump()

    def leave(self, queue_id: str) -> None:
        g = self.groups.pop(queue_id, None)
        if g is not None:
            self._tasks.spawn(self._detach(g), name="group-detach")

    async def _detach(self, g: GroupRead) -> None:
        """After the acks owed: what this member claimed and did not finish goes back."""
        await self._unlisten(g)
        await self._give_back(g)

    async def _give_back(self, g: GroupRead, tell: bool = True) -> None:
        """Forget this member's claims of `g`; `tell` the owner (the others get them)."""
        await self._flush()
        g.held.clear()
        for pid in [p for p, (q, _) in self.by_pid.items() if q == g.queue_id]:
            del self.by_pid[pid]
        if not tell:
            return
        try:
            await self._queue.ack(self._tenant, g.queue_id, 0, detach_reader=self.member)
        except Exception as exc:  # the owner gives the claims back after the member's TTL
            log.warning("group_detach_failed", extra={"error": repr(exc)})

    async def _unlisten(self, g: GroupRead) -> None:
        sub, g.notices = g.notices, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:
                log.debug("group_unsubscribe_failed", extra={"error": repr(exc)})

    def start(self) -> None:
        self._started = True
        self.pump()

    async def close(self) -> None:
        """The connection ended: leave every group (the claims go to other members, in
        the background: the socket's close does not wait for the groups' owners)."""
        self._closed = True
        for qid in list(self.groups):
            self.leave(qid)

    def poll(self) -> None:
        """The safety net for a lost notice; also tells the owners this member lives."""
        for g in self.groups.values():
            g.more = True
            if g.active and not g.reading and self._room() <= 0:
                self._tasks.spawn(self._claim(g, 0), name="group-renew")
        self.pump()

    # ---- reading and sending ---------------------------------------------------------------

    def _room(self) -> int:
        ob = self._channel.outbound
        return 0 if ob.congested else ob.free_window

    def pump(self) -> None:
        if not self._started or self._closed:
            return
        for g in list(self.groups.values()):
            if g.held:
                self._send(g)
            if g.active and g.more and not g.reading and not g.held and self._room() > 0:
                g.reading = True
                self._tasks.spawn(self._read(g), name="group-read")

    async def _read(self, g: GroupRead) -> None:
        try:
            while g.more and g.active and not self._closed and g.queue_id in self.groups:
                room = min(self._room(), CLAIM_BATCH)
                if room <= 0 or g.held:
                    return
                heard = g.heard
                got = await self._claim(g, room)
                if got is None:
                    return
                if not got and g.heard == heard:
                    g.more = False
        finally:
            g.reading = False

    async def _claim(self, g: GroupRead, room: int) -> int | None:
        """Claim up to `room` entries and send them; how many came (None: no answer)."""
        try:
            resp = await self._queue.read(
                self._tenant, g.queue_id, 0, room, mark_delivered=True, reader=self.member
            )
        except Exception as exc:  # the queue service is away: the next poll tries again
            log.warning("group_read_failed", extra={"error": type(exc).__name__})
            return None
        if g.queue_id not in self.groups or self._closed:
            return None  # left meanwhile: the detach gives them back
        g.dup_through = resp.delivered_through
        g.held.extend(resp.entries)
        self._send(g)
        return len(resp.entries)

    def _send(self, g: GroupRead) -> None:
        ob = self._channel.outbound
        now = self._now()
        sent = False
        while g.held and len(ob.inflight) < ob.receive_maximum and not ob.congested:
            e = g.held.popleft()
            pid = self._free_pid()
            msg = e.message
            qos = min(msg.qos, g.qos)
            ok = False
            if qos and ob.may_send(msg):
                dup = e.seq <= g.dup_through
                ok = ob.deliver_stored(msg, qos, False, g.sub_ids, pid, dup, now)
            elif qos:
                g.held.appendleft(e)  # the bandwidth budget is spent: later
                break
            else:
                ob.deliver(msg, 0, False, g.sub_ids, now)
            sent = True
            if ok:
                self.by_pid[pid] = (g.queue_id, e.seq)
            else:  # QoS 0, expired or too large: done without an ack to wait for
                self._done(g.queue_id, e.seq)
        if sent and self._channel.out:
            self._wrote()
        if self._scan and self.by_pid and not self._scanning:
            self._scanning = True
            self._tasks.spawn(self._scan_inflight(), name="group-scan")

    async def _scan_inflight(self) -> None:
        """A clean session's completions: its packet ids that left the in-flight set (PUBACK,
        PUBCOMP) are done. (A PUBREC'd one stays in flight until PUBCOMP: still the client's.)"""
        renew_at = time.monotonic() + RENEW_S
        try:
            while self.by_pid and not self._closed:
                await asyncio.sleep(SCAN_S)
                inflight = self._channel.outbound.inflight
                done = [pid for pid in self.by_pid if pid not in inflight]
                if done:
                    self.progress(done, [])
                if time.monotonic() >= renew_at:  # no sweeper polls a clean session
                    renew_at = time.monotonic() + RENEW_S
                    self.poll()
        finally:
            self._scanning = False

    def _free_pid(self) -> int:
        inflight, taken, mine = self._channel.outbound.inflight, self._taken, self.by_pid
        pid = self._next_pid
        while True:
            pid = pid + 1 if pid < 65535 else 1
            if pid not in inflight and pid not in taken and pid not in mine:
                self._next_pid = pid
                return pid

    # ---- the client's acks -------------------------------------------------------------

    def progress(self, completed: list[int], released: list[int]) -> None:
        """Packet ids the client finished (PUBACK, PUBCOMP) or PUBREC'd that are not the
        session queue's: those of group entries are acknowledged to their queue."""
        ob = self._channel.outbound
        for pid in released:
            got = self.by_pid.pop(pid, None)
            if got is not None:
                ob.send_pubrel(pid)  # the client has it; its PUBCOMP then finds nothing here
                self._done(*got)
        for pid in completed:
            got = self.by_pid.pop(pid, None)
            if got is not None:
                self._done(*got)
        if released and self._channel.out:
            self._wrote()
        self.pump()

    def _done(self, queue_id: str, seq: int) -> None:
        self._acks.setdefault(queue_id, []).append(seq)
        if not self._acking:
            self._acking = True
            self._tasks.spawn(self._flush(), name="group-acks")

    async def _flush(self) -> None:
        """Send the acks owed, one call per group queue, until none is left."""
        self._acking = True
        failures = 0
        try:
            while self._acks:
                if not self._closed:
                    await asyncio.sleep(ACK_DELAY_S)  # more come meanwhile: one call for them
                acks, self._acks = self._acks, {}
                for qid, seqs in acks.items():
                    if not await self._ack(qid, seqs) and failures < ACK_TRIES:
                        failures += 1  # (the owner may be moving: tried again, bounded)
                        self._acks.setdefault(qid, []).extend(seqs)
                        await asyncio.sleep(ACK_RETRY_S)
        finally:
            self._acking = False

    async def _ack(self, qid: str, seqs: list[int]) -> bool:
        try:
            await self._queue.ack(self._tenant, qid, 0, renew=(self.member, 0, 0), seqs=seqs)
        except Exception as exc:  # not acknowledged: handed out again (at least once)
            log.warning("group_ack_failed", extra={"error": type(exc).__name__})
            return False
        return True
