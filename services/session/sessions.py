"""Persistent session state: records in the store, cleanup of ended sessions, expiry.

The session service owns session records; the router owns their subscriptions and the queue
service their queues, so ending a session asks both to forget that incarnation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.common import clock
from services.common.store.ports_session import (
    InboundQos2,
    Qos2Update,
    SessionRecord,
    SessionStore,
    SubscriptionRecord,
)
from services.common.tasks import TaskSet
from services.queue.client import QueueClient, queue_id
from services.router.client import RouterClient
from services.session.core import decide, expired
from services.session.events import Events

log = logging.getLogger("starling.session")

# Compare-and-set rounds of one open, close or park before it gives up: each lost round
# means another instance wrote the record in between, which a client id's own connections
# do a few times at most.
CAS_TRIES = 5


class StaleConnectError(Exception):
    """A later connection took the client id while this CONNECT was decided: this one was
    displaced (answered as taken over)."""


class SessionContendedError(Exception):
    """The record kept changing under one decision (CAS_TRIES rounds) although this
    connection still holds the client id: the CONNECT fails (server unavailable; retried)."""


@dataclass(frozen=True, slots=True)
class Opened:
    present: bool
    incarnation: int
    expiry_s: int
    subscriptions: tuple[SubscriptionRecord, ...] = ()  # of a resumed session
    awaiting_release: tuple[InboundQos2, ...] = ()  # its QoS 2 publishes awaiting PUBREL
    # The client id had a session record (resumed or ended now): a delayed will of its last
    # connection may be pending; without one none can be (a will is delayed by at most the
    # session's expiry, services/connection/wills.py).
    previous: bool = True
    # The session record's QoS 2 fence as this connection set it (0: no persistent session),
    # which the node stamps on its QoS 2 receiver-state changes (Qos2Update.fence).
    qos2_fence: int = 0


class Unread:
    """`Sessions.open` reads the record itself."""


UNREAD = Unread()


def owner_of(rec: SessionRecord | None) -> str | None:
    """Who a session record's session belongs to (None: no live session, or its owner is
    unknown)."""
    if rec is None or expired(rec, clock.now_ms()):
        return None
    return rec.owner


class Sessions:
    def __init__(
        self,
        *,
        store: SessionStore,
        router: RouterClient,
        queues: QueueClient,
        max_expiry_s: int,
        events: Events,
        session_ended: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._router = router
        self._queues = queues
        self._max_expiry = max_expiry_s
        self._events = events
        # A persistent session's record is gone: it stops counting against the tenant's
        # max_sessions (services/session/registry.py counts them at CONNECT).
        self._session_ended = session_ended
        self._tasks = TaskSet()  # discards of ended sessions, off the CONNECT path
        # Sessions this instance ended by their expiry, per tenant, since it started
        # (`$SYS/broker/clients/expired`, reported to the metrics service).
        self.expired_by_tenant: dict[str, int] = {}

    @property
    def max_expiry_s(self) -> int:
        return self._max_expiry

    async def read(self, tenant: str, client_id: str) -> SessionRecord | None:
        """The client id's session record as stored (it may have expired)."""
        return await self._store.get_session(tenant, client_id)

    async def owner(self, tenant: str, client_id: str) -> str | None:
        """Who the client id's session belongs to (None: no live session, or its owner is
        unknown)."""
        return owner_of(await self._store.get_session(tenant, client_id))

    async def open(
        self,
        tenant: str,
        client_id: str,
        clean_start: bool,
        expiry_s: int,
        owner: str = "",
        rec: SessionRecord | Unread | None = UNREAD,
        epoch: int = 0,
        current: Callable[[], Awaitable[bool]] | None = None,
    ) -> Opened:
        """Resume or start the client id's session; a new or resumed one belongs to `owner`
        from now on. `rec`: its record as `read` returned it under the client id's lock, if
        nothing changed it since (saves reading it again on the CONNECT path). `epoch`: the
        registry epoch of the connection that opens it. The record's QoS 2 fence goes above
        every earlier connection's, in the write that opens the session (no trip of its own):
        at the epoch, or one above the last fence if a clock behind another session
        instance's gave a lower epoch. From then on, the QoS 2 changes an earlier connection
        still writes are ignored.

        Every write is a compare-and-set against the record this decision was made from:
        another session instance may be opening or closing the same client id at once (a
        quick reconnect whose CONNECT and the old connection's release reach different
        instances). If the record changed, the decision is made again from the new one,
        unless `current` (is this CONNECT's registry entry still the installed one?) says a
        later connection took the client id meanwhile: then this one is stale
        (`StaleConnectError`). A discard follows only a write that ended the session (or
        finds it ended), so it never takes the subscriptions and queue of a session another
        connection resumed."""
        expiry_s = min(expiry_s, self._max_expiry)
        if isinstance(rec, Unread):
            rec = await self._store.get_session(tenant, client_id)
        for round_ in range(CAS_TRIES):
            # A connected record at least as new as this CONNECT, or a record that changed
            # under it: is this connection still the client id's? (The registry decides, not
            # the fences: a clock behind can push a fence above a newer epoch.)
            suspect = round_ > 0 or (
                rec is not None and rec.connected and epoch and rec.qos2_fence >= epoch
            )
            if suspect and current is not None and not await current():
                raise StaleConnectError("a later connection holds the client id")
            opened = await self._try_open(
                tenant, client_id, clean_start, expiry_s, owner, rec, epoch
            )
            if opened is not None:
                return opened
            rec = await self._store.get_session(tenant, client_id)
        raise SessionContendedError(f"the session record changed {CAS_TRIES} times")

    async def _try_open(
        self,
        tenant: str,
        client_id: str,
        clean_start: bool,
        expiry_s: int,
        owner: str,
        rec: SessionRecord | None,
        epoch: int,
    ) -> Opened | None:
        """One decision from `rec`; None if the record was no longer `rec` (nothing done)."""
        d = decide(rec, clean_start, expiry_s, time.time_ns() // 1000)
        if d.discard is not None and not d.persist:
            # Ended before this CONNECT is answered: a persistent CONNECT right after it
            # must not resume the session being discarded (Session Present with nothing
            # in it). Expired rather than deleted: if the discard fails, the expiry sweep
            # ends it (a new persistent session writes over its record anyway). Expired
            # since 0, whatever the clock of the session instance that reads it next.
            ended = _ended(d.discard)
            if ended != rec and not await self._store.replace_session(ended, rec):
                return None
        fence = 0
        if d.persist or d.present:
            fence = epoch
            if rec is not None and rec.incarnation == d.incarnation:
                fence = max(epoch, rec.qos2_fence + 1)
            record = SessionRecord(
                tenant, client_id, d.incarnation, expiry_s, True, owner=owner, qos2_fence=fence
            )
            if not await self._store.replace_session(record, rec):
                return None
        if d.discard is not None:
            # A new persistent session of the client id keeps the count the old one held.
            discard = self._discard(d.discard, keep_count=d.persist)
            self._tasks.spawn(discard, name="session_discard")
        subs: tuple[SubscriptionRecord, ...] = ()
        awaiting: tuple[InboundQos2, ...] = ()
        if d.present:
            subs = tuple(await self._store.list_subscriptions(tenant, client_id, d.incarnation))
            awaiting = tuple(await self._store.list_qos2(tenant, client_id, d.incarnation))
        return Opened(d.present, d.incarnation, expiry_s, subs, awaiting, rec is not None, fence)

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        """QoS 2 receiver state changes of persistent sessions, durable when this returns."""
        await self._store.record_qos2(updates)

    async def close(
        self,
        tenant: str,
        client_id: str,
        incarnation: int,
        expiry_s: int | None,
        fence: int = 0,
        epoch: int = 0,
    ) -> None:
        """The connection that opened the session with QoS 2 `fence` ended: park the session
        (its expiry clock starts) or, with expiry 0, end it. Nothing if a later connection
        opened it since: the record has another fence or incarnation. Without the fence,
        `epoch` (the connection's registry epoch) bounds it: a later connection's fence is
        above it. (Neither: any.)"""
        for _ in range(CAS_TRIES):
            rec = await self._store.get_session(tenant, client_id)
            if rec is None or rec.incarnation != incarnation or _opened_since(rec, fence, epoch):
                return
            if _ended_by_clean_start(rec):
                return  # ended already (a clean start): a DISCONNECT's expiry must not revive it
            expiry = rec.expiry_interval_s if expiry_s is None else min(expiry_s, self._max_expiry)
            if await self._park_or_end(rec, expiry, clock.now_ms()):
                return
            fence = rec.qos2_fence  # a retry is for this same connection's record only
        log.warning("session_close_raced", extra={"tenant": tenant, "client_id": client_id})

    async def _park_or_end(self, rec: SessionRecord, expiry: int, at_ms: int) -> bool:
        """Write `rec` disconnected since `at_ms` (expiry 0: ended, then discarded) if the
        store still has it as read; False if another write came first."""
        if expiry == 0:
            ended = _ended(rec)
            if not await self._store.replace_session(ended, rec):
                return False
            await self._discard(ended)
            return True
        parked = dataclasses.replace(
            rec, expiry_interval_s=expiry, connected=False, disconnected_at_ms=at_ms
        )
        return await self._store.replace_session(parked, rec)

    async def ended(self, tenant: str, client_id: str, expiry_s: int | None, epoch: int) -> None:
        """The connection with registry `epoch`, holding the current session, ended (with this
        Session Expiry from its DISCONNECT, if any) and a new CONNECT displaced it before its
        release arrived."""
        rec = await self._store.get_session(tenant, client_id)
        if rec is not None:
            await self.close(tenant, client_id, rec.incarnation, expiry_s, epoch=epoch)

    async def park(self, tenant: str, client_id: str, at_ms: int, epoch: int = 0) -> None:
        """The node holding the client's connection (registry `epoch`) died: the session is
        disconnected since `at_ms`, unless a later connection opened it meanwhile."""
        fence = 0
        for _ in range(CAS_TRIES):
            rec = await self._store.get_session(tenant, client_id)
            if rec is None or not rec.connected or _opened_since(rec, fence, epoch):
                return
            if await self._park_or_end(rec, rec.expiry_interval_s, at_ms):
                return
            fence = rec.qos2_fence  # a retry is for this same connection's record only

    async def discard_offline(self, tenant: str, client_id: str) -> bool:
        """An administrator ends the client id's parked session as its expiry would (the
        record ended by a compare-and-set, then `_discard`); False if it has none, or it is
        connected (or reconnects under this call: the compare-and-set then loses)."""
        cur = await self._store.get_session(tenant, client_id)
        if cur is None or cur.connected or _ended_by_clean_start(cur):
            return False
        rec = _ended(cur)
        if not await self._store.replace_session(rec, cur):
            return False
        await self._events.emit(tenant, client_id, "session_expired")
        log.info("session_discarded", extra={"tenant": tenant, "client_id": client_id})
        await self._discard(rec)
        return True

    async def _discard(self, rec: SessionRecord, keep_count: bool = False) -> bool:
        """End a session incarnation: forget its subscriptions, its queue, its record (and,
        unless `keep_count`, its place in the tenant's session count). True when its record
        went here (not already gone, nor replaced by a newer session's)."""
        try:
            await self._router.drop_session(rec.tenant, rec.client_id, rec.incarnation)
            await self._queues.drop(rec.tenant, queue_id(rec.client_id, rec.incarnation))
        except Exception as exc:  # retried by the expiry sweep while the record remains
            log.warning("session_discard_failed", extra={"error": str(exc)})
            return False
        await self._store.drop_qos2(rec.tenant, rec.client_id, rec.incarnation)
        deleted = await self._store.delete_session(rec.tenant, rec.client_id, rec.incarnation)
        # Only if this incarnation's record was the one stored: a newer session of the client
        # id (which replaced it) still counts.
        if deleted and not keep_count and self._session_ended is not None:
            try:
                await self._session_ended(rec.tenant, rec.client_id)
            except Exception as exc:  # stays counted (one too many) until Redis loses it
                log.warning("session_count_release_failed", extra={"error": str(exc)})
        return deleted

    async def sweep(self) -> int:
        """End every session whose expiry has passed; works with no node up."""
        now_ms = clock.now_ms()
        due = await self._store.expired_sessions(now_ms)
        for found in due:
            rec = found
            # A session a clean start ended (its record written expired since 0 by `open`,
            # its own discard maybe failed) is only discarded, not reported as expired.
            if not _ended_by_clean_start(found):
                # Ended by a compare-and-set first, as `open` and `close` end one: a resume
                # that read the record just before it expired then decides again (a new
                # session) instead of keeping one this discard deletes.
                cur = await self._store.get_session(found.tenant, found.client_id)
                if cur is None or cur.incarnation != found.incarnation or not expired(cur, now_ms):
                    continue  # resumed or replaced since the scan
                if _ended_by_clean_start(cur):
                    continue  # ended since the scan (a clean start, another sweep): theirs
                rec = _ended(cur)
                if not await self._store.replace_session(rec, cur):
                    continue
                # Reported once: by the instance whose write ended it (a discard that fails
                # is retried by a later sweep, silently).
                await self._events.emit(rec.tenant, rec.client_id, "session_expired")
                self.expired_by_tenant[rec.tenant] = self.expired_by_tenant.get(rec.tenant, 0) + 1
                log.info(
                    "session_expired", extra={"tenant": rec.tenant, "client_id": rec.client_id}
                )
            await self._discard(rec)
        return len(due)

    async def run_sweeper(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.sweep()
            except Exception:  # keep sweeping; one bad pass must not stop expiry
                log.exception("session_sweep_failed")

    async def stop(self, grace_s: float) -> None:
        """Let discards in flight finish for at most `grace_s`, then cancel the rest."""
        await self._tasks.wait(grace_s)
        await self._tasks.cancel()


def _opened_since(rec: SessionRecord, fence: int, epoch: int) -> bool:
    """A later connection opened the session than the one with QoS 2 `fence` (exact) or, not
    knowing it, with registry `epoch` (every later connection's fence is above its epoch; a
    fence pushed above its own epoch by a clock behind reads as later: the session is then
    left connected, never wrongly parked)."""
    if fence:
        return rec.qos2_fence != fence
    return bool(epoch) and rec.qos2_fence > epoch


def _ended(rec: SessionRecord) -> SessionRecord:
    """`rec` ended now: expired since 0 whatever any instance's clock, and resumable by
    nobody (what `_ended_by_clean_start` recognises)."""
    return dataclasses.replace(rec, expiry_interval_s=0, connected=False, disconnected_at_ms=0)


def _ended_by_clean_start(rec: SessionRecord) -> bool:
    """The record `Sessions.open` writes for a session a clean start ended (no session is
    otherwise stored disconnected with expiry 0: `close` discards it)."""
    return rec.expiry_interval_s == 0 and rec.disconnected_at_ms == 0 and not rec.connected
