"""QoS 2 from a persistent session's client, exactly once across reconnects to any node: the
receiver state the session service stores for it (`Qos2Journal`) and the order a
connection's publishes keep while it is written (`ExactlyOnceInbound`). Ended connections
whose records are still being written: services/connection/settling.py.

Theory of operation:
- A new QoS 2 PUBLISH gets its message id here and is recorded with the session (RECEIVED:
  packet id -> message id) before it is routed, so PUBREC (sent once routed) implies both
  the message and the receiver state are durable. A resend on another node finds the id in
  the resumed session: stored already, it is only answered; otherwise it is routed again
  under the recorded id and the queue's de-duplication keeps one copy. Only the store sees
  such a resend: the transient fan-out had the message from the first node.
- PUBREL: RELEASED is written before PUBCOMP, so a new message under the same id is never
  taken for a resend. A PUBREC with an error ends the exchange the same way.
- When the connection ends, the ids routed and not released are marked STORED: a client
  that comes back after the queue's de-duplication window still gets no second copy.
- While a record is being written, the connection's later publishes (any QoS) wait behind
  it, so the order the client sent them in is kept. Publishes of other connections, and a
  persistent session's QoS 0/1 when no QoS 2 is pending, never wait.
- The journal sends the changes of every connection of the node in one request while the
  previous one is under way (one transaction in the session store): under load a QoS 2
  publish costs a share of one durable write, not one each.
- A connection that ends with records being written is released to the session service
  only once they are written, and a takeover's kick is answered only then: the next
  connection, on any node, resumes a session that already knows every id this one took.
  Both waits are bounded (the node's SETTLE_S); past it, nothing still being written
  is routed from this connection, even once written: the client, which got no PUBREC for
  it, resends it to the next connection, which may already have taken it under a new id.
- Every record carries the session's QoS 2 fence as this connection set it when it opened
  the session: once a later connection opened it (on any node), with a higher fence, the
  session store ignores the RECEIVED and RELEASED an earlier one still writes.
  Without it, a RECEIVED written after its connection was given up could land after the
  next connection's RELEASED for the same id, and a third connection would take a new
  message under that id for a resend of one never routed (stored, but not delivered to
  clean subscribers).
- A record the session service did not confirm is written again (idempotent), with backoff,
  before anything of that connection is published: a failed call may have been written all
  the same, and giving up at once would leave a record that says "received" for a message
  nobody published (a resend would then reach the store but not clean subscribers). Only
  after 30 s of failures is the connection closed without the acks; the client resends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from services.common.message import Message
from services.common.store.ports_session import Qos2Change, Qos2Update
from services.common.tasks import TaskSet

log = logging.getLogger("starling.connection.qos2")

# Updates per RecordQos2 request (the session service refuses more than MAX_QOS2_UPDATES).
QOS2_BATCH = 1024
# Backoff of a record the session service did not confirm (as the routing pipeline's).
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


class Recorder(Protocol):
    async def record_qos2(self, updates: list[Qos2Update]) -> None: ...


class Qos2Journal:
    """Changes to the QoS 2 receiver state of this node's persistent sessions, written in
    batches: everything that arrives while a write is under way goes in the next one."""

    def __init__(
        self, recorder: Recorder, max_batch: int = QOS2_BATCH, give_up_s: float = 30.0
    ) -> None:
        self._recorder = recorder
        self._max_batch = max_batch
        self._give_up_s = give_up_s
        self._waiting: deque[tuple[list[Qos2Update], asyncio.Future[None]]] = deque()
        self._wake = asyncio.Event()

    async def write(self, updates: list[Qos2Update]) -> None:
        """Durable once this returns; raises if the session service could not write it."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((updates, done))
        self._wake.set()
        await done

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                batch = [self._waiting.popleft()]
                size = len(batch[0][0])
                while self._waiting and size + len(self._waiting[0][0]) <= self._max_batch:
                    size += len(self._waiting[0][0])
                    batch.append(self._waiting.popleft())
                await self._flush(batch)

    async def _flush(self, batch: list[tuple[list[Qos2Update], asyncio.Future[None]]]) -> None:
        """Write `batch`, retried with backoff for up to `give_up_s`: a call that failed may
        still have been written (the service died before answering), and only a write
        known to be done tells whether the message went out; the changes are idempotent, and
        later batches wait behind this one, so their order holds."""
        updates = [u for ups, _ in batch for u in ups]
        started = time.monotonic()
        delay = RETRY_FIRST_S
        while True:
            try:
                await self._recorder.record_qos2(updates)
                break
            except Exception as exc:
                log.warning("qos2_record_failed", extra={"error": type(exc).__name__})
                if time.monotonic() - started + delay > self._give_up_s:
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        for _, done in batch:
            if not done.done():
                done.set_result(None)


class ExactlyOnceInbound:
    """One connection of a persistent session: its publishes, with QoS 2 recorded first."""

    def __init__(
        self,
        *,
        tenant: str,
        client_id: str,
        incarnation: int,
        journal: Qos2Journal,
        new_id: Callable[[], str],
        publish: Callable[[list[Message]], None],
        store_only: Callable[[Message], None],
        failed: Callable[[], None],
        tasks: TaskSet,
        fence: int,
    ) -> None:
        self._key = (tenant, client_id, incarnation)
        # The session's QoS 2 fence as this connection set it, on every record: once a later
        # connection opened the session, what this one still writes is ignored.
        self._fence = fence
        self._journal = journal
        self._new_id = new_id
        self._publish = publish  # the node's whole path: fan-out, mesh and router
        self._store_only = store_only  # the router alone, under the message's own id
        self._failed = failed  # the record could not be written: close without acks
        self._tasks = tasks
        self._queue: deque[list[Message]] = deque()
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._broken = False
        self._abandoned = False  # `idle` ran out: nothing pending is routed from here
        self.recorded: dict[int, str] = {}  # packet id -> message id, not released yet
        self._routed: set[int] = set()  # of `recorded`: the router has stored them
        self._ended = False

    def route(self, msgs: list[Message]) -> None:
        """A Route of the channel, in the order the client sent it."""
        if self._broken or self._abandoned:
            return
        if not self._queue and all(m.qos != 2 for m in msgs):
            self._publish(msgs)  # nothing to record, nothing ahead of it
            return
        self._queue.append(msgs)
        if not self._draining:
            self._draining = True
            self._idle.clear()
            self._tasks.spawn(self._drain(), name="qos2-record")

    async def _drain(self) -> None:
        try:
            while self._queue:
                assigned, updates = self._assign(self._queue[0])
                if updates:
                    try:
                        await self._journal.write(updates)
                    except Exception:
                        self._broken = True  # nothing more is routed for this connection
                        self._queue.clear()
                        self._failed()
                        return
                if self._abandoned:
                    self._queue.clear()  # written too late to be routed from here: `idle`
                    return
                self._queue.popleft()
                self._send(assigned)
        finally:
            self._draining = False
            self._idle.set()

    @property
    def busy(self) -> bool:
        """Records are being written (publishes wait behind them)."""
        return self._draining

    async def idle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until no record is being written; past it, this
        connection is given up on: nothing it still has pending is routed from here."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("qos2_records_still_pending")
            # The connection's release (or a takeover's kick reply) goes ahead without them,
            # so the client may resend these publishes to its next connection before they
            # are written, which then takes them under new ids: routed from here as well once
            # written, each would be stored twice (QoS 2 delivered twice). Nothing still
            # being written is routed from here now; no PUBREC went out for it, so the client
            # resends it, and its next connection routes it once.
            self._abandoned = True

    def _assign(self, msgs: list[Message]) -> tuple[list[tuple[Message, bool]], list[Qos2Update]]:
        """Message ids for the new QoS 2 publishes of `msgs`, and their RECEIVED records;
        each message comes back with whether it goes to the store only (a resend the
        channel routed again under its recorded id)."""
        out: list[tuple[Message, bool]] = []
        updates: list[Qos2Update] = []
        tenant, client_id, incarnation = self._key
        for m in msgs:
            resend = False
            if m.qos == 2 and m.packet_id:
                if m.message_id:
                    resend = True
                else:
                    m = m._replace(message_id=self._new_id())
                    updates.append(
                        Qos2Update(
                            tenant,
                            client_id,
                            incarnation,
                            Qos2Change.RECEIVED,
                            m.packet_id,
                            m.message_id,
                            self._fence,
                        )
                    )
                self.recorded[m.packet_id] = m.message_id
                self._routed.discard(m.packet_id)
            out.append((m, resend))
        return out, updates

    def _send(self, msgs: list[tuple[Message, bool]]) -> None:
        """Publish in order; a resend the store may have already goes to the store only."""
        run: list[Message] = []
        for m, resend in msgs:
            if resend:
                if run:
                    self._publish(run)
                    run = []
                self._store_only(m)
            else:
                run.append(m)
        if run:
            self._publish(run)

    def routed(self, packet_id: int) -> None:
        """The router stored the message under `packet_id`."""
        message_id = self.recorded.get(packet_id)
        if message_id is None:
            return
        self._routed.add(packet_id)
        if self._ended:  # routed after the connection ended: mark it now
            tenant, client_id, incarnation = self._key
            stored = Qos2Update(
                tenant,
                client_id,
                incarnation,
                Qos2Change.STORED,
                packet_id,
                message_id,
                self._fence,
            )
            self._tasks.spawn(self._mark([stored]), name="qos2-stored")

    async def release(self, packet_id: int, done: Callable[[], None]) -> None:
        """PUBREL (or a PUBREC with an error): forget the id durably, then `done`."""
        self.recorded.pop(packet_id, None)
        self._routed.discard(packet_id)
        tenant, client_id, incarnation = self._key
        try:
            await self._journal.write(
                [
                    Qos2Update(
                        tenant,
                        client_id,
                        incarnation,
                        Qos2Change.RELEASED,
                        packet_id,
                        fence=self._fence,
                    )
                ]
            )
        except Exception:
            self._failed()  # no PUBCOMP: the client resends PUBREL after reconnecting
            return
        done()

    async def ended(self) -> None:
        """The connection is gone: mark what was routed and not released as stored (what
        is still being routed is marked when its answer comes)."""
        self._ended = True
        tenant, client_id, incarnation = self._key
        updates = [
            Qos2Update(tenant, client_id, incarnation, Qos2Change.STORED, pid, mid, self._fence)
            for pid, mid in self.recorded.items()
            if pid in self._routed
        ]
        if updates:
            await self._mark(updates)

    async def _mark(self, updates: list[Qos2Update]) -> None:
        try:
            await self._journal.write(updates)
        except Exception:  # only costs a re-route (de-duplicated) on a resend
            log.warning("qos2_stored_marks_lost", extra={"ids": len(updates)})
