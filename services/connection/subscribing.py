"""SUBSCRIBE and UNSUBSCRIBE on a node: the trie, the NATS subscriptions, the router.

Theory of operation: a subscription enters the node's trie at once, so a PUBLISH that follows
the SUBSCRIBE on any connection of this node already matches it. The NATS subscriptions for
its subjects (other nodes' traffic), the router (a persistent session's stored
subscriptions) and then the SUBACK and retained replay follow in order on `OrderedOps`: the
SUBACK goes out only once NATS confirmed the subscriptions with a flush, so a message
published anywhere after the client saw its SUBACK is never missed. The tenant's
auto-subscriptions at connect take the same path, and the CONNACK stands in for the SUBACK.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.common.group_routes import group_queue_id, split_shared
from services.common.topics import NO_LIMITS, parse_shared
from services.connection.channel import Channel, SubscribeRequest
from services.connection.conn import Conn
from services.connection.events import SubscriptionEvents
from services.connection.fanout import Fanout
from services.connection.group_members import CleanGroupMembers
from services.connection.interest import MeshInterest
from services.connection.ordered import OrderedOps
from services.connection.retained import RetainedReplay
from services.connection.shared import SharedDispatch
from services.connection.subscription_slots import SubscriptionSlots
from services.connection.subscriptions import (
    NodeSubscriptions,
    SharedGroup,
    entry_for,
    redelivery_subject,
)
from services.connection.writes import WriteBatcher
from services.queue.client import QueueClient
from services.router.client import RouterClient
from starling.router.v1 import router_pb2

log = logging.getLogger("starling.connection.subscribing")

SUBSCRIBE_FAILED = 0x80  # SUBACK code for a filter the node could not subscribe
QUOTA_EXCEEDED = 0x97  # MQTT 5 SUBACK code of a filter past the tenant's subscriptions


def without(req: SubscribeRequest, filters: set[str], code: int) -> SubscribeRequest:
    """The same SUBSCRIBE with `filters` refused with `code` (their slots among the reason
    codes are those of the accepted subscriptions, in order)."""
    codes = list(req.reason_codes)
    kept, fresh = [], []
    accepted = iter(enumerate(req.subscriptions))
    for i, c in enumerate(codes):
        if c >= 0x80:
            continue
        j, (s, sub_id) = next(accepted)
        if s.filter in filters:
            codes[i] = code
        else:
            kept.append((s, sub_id))
            if req.fresh:
                fresh.append(req.fresh[j])
    return replace(req, subscriptions=tuple(kept), reason_codes=tuple(codes), fresh=tuple(fresh))


def refused(req: SubscribeRequest) -> SubscribeRequest:
    """The same SUBSCRIBE answered with 0x80 for every filter that was to be granted."""
    codes = tuple(SUBSCRIBE_FAILED if c < 0x80 else c for c in req.reason_codes)
    return replace(req, subscriptions=(), reason_codes=codes, fresh=())


def _uncounted(limit: str, tenant: str, n: int) -> None:
    """The default `Subscriber.on_refused`: nobody counts."""


class Subscriber:
    def __init__(
        self,
        *,
        node_id: str,
        subs: NodeSubscriptions[Conn],
        nc: Client,
        nc_shared: Client,
        ops: OrderedOps,
        fanout: Fanout,
        shared: SharedDispatch,
        retained: RetainedReplay,
        writes: WriteBatcher,
        router: RouterClient | None,
        interest: MeshInterest | None = None,
        events: SubscriptionEvents | None = None,
        slots: SubscriptionSlots | None = None,
        on_refused: Callable[[str, str, int], None] | None = None,
        queue: QueueClient | None = None,
    ) -> None:
        """`events`: where subscription events go when rules may read them; `slots`:
        tenants' max_tenant_subscriptions (None: not enforced), refusals counted by
        `on_refused(limit, tenant, n)`; `queue`: for clean sessions' reads of durable
        shared groups (None: no queue service)."""
        self.clean_members = (
            CleanGroupMembers(queue=queue, nc=nc_shared, wrote=writes.mark)
            if queue is not None
            else None
        )
        self._node_id = node_id
        self.events = events
        self._interest = interest
        self.subs = subs
        self._nc = nc
        self._nc_shared = nc_shared
        self._ops = ops
        self._fanout = fanout
        self._shared = shared
        self._retained = retained
        self._writes = writes
        self._router = router
        self._nats_subs: dict[str, NatsSubscription] = {}
        self._keys: dict[str, set[str]] = {}  # tenant -> its keys in _nats_subs
        self._shared_keys: dict[str, set[str]] = {}  # tenant -> those of shared groups
        self.slots = slots
        self.on_refused = on_refused or _uncounted

    def inbound_backlog_bytes(self) -> int:
        """Bytes NATS handed us that no subscription task has delivered yet."""
        return sum(sub.pending_bytes for sub in self._nats_subs.values())

    def subscribe(
        self,
        conn: Conn,
        req: SubscribeRequest,
        persist: bool = False,
        answer: bool = True,
        auto: bool = False,
    ) -> None:
        """Add to the trie now; NATS, the router (`persist`), the SUBACK (`answer`) and
        retained replay follow in order. `auto`: the tenant's auto-subscriptions at connect
        (the CONNACK instead of a SUBACK, then retained replay as for a SUBSCRIBE); neither
        `answer` nor `auto`: a resumed session's subscriptions (restored, not new: no
        replay, no event)."""
        new_subjects, new_groups, added = self._add(conn, req)
        # Only a client's SUBSCRIBE is checked: a resumed session's and the tenant's
        # auto-subscriptions are counted (reported with the node's figure), never refused.
        check = self.slots is not None and answer and added

        async def op() -> None:
            if check:
                req_now = await self._slots(conn, req, added)
            else:
                req_now = req
            final = await self._complete(conn, req_now, new_subjects, new_groups, persist)
            await self._join_groups(conn, final)
            if answer:
                conn.channel.subscribed(final)
                self._writes.mark(conn)
            elif auto:  # all of them, or the CONNECT is refused (Channel.auto_subscribed)
                ok = len(final.subscriptions) == len(req.subscriptions)
                conn.shell.carry_out(conn, conn.channel.auto_subscribed(ok, time.time()))
            if (answer or auto) and final.subscriptions:
                await self._retained.replay(conn, final)
                if self.events is not None:
                    ch = conn.channel
                    user = ch.identity.partition("/")[2]
                    self.events.subscribed(ch.tenant, ch.client_id, user, final.subscriptions, auto)

        self._ops.put(op)

    def _add(
        self, conn: Conn, req: SubscribeRequest
    ) -> tuple[list[str], list[SharedGroup[Conn]], list[str]]:
        """Put the SUBSCRIBE's filters in the node's trie (and shared groups). Returns the
        NATS subjects and shared groups new on this node, and the filters the client did not
        hold (each takes a tenant slot)."""
        tenant = conn.channel.tenant
        new_subjects: list[str] = []
        new_groups: list[SharedGroup[Conn]] = []
        held = self.subs.counts.get(tenant, 0)
        added: list[str] = []
        for s, sub_id in req.subscriptions:
            shared = parse_shared(s.filter, NO_LIMITS)
            if shared is None:
                entry = entry_for(
                    s.filter, tenant, s.qos, s.no_local, s.retain_as_published, sub_id
                )
                new_subjects += self.subs.add(tenant, conn, entry)
            else:
                entry = entry_for(shared.filter, tenant, s.qos, False, False, sub_id)
                g = self.subs.add_shared(tenant, shared.group, conn, entry)
                if g is not None:
                    new_groups.append(g)
            if self.subs.counts.get(tenant, 0) > held:
                held += 1
                added.append(s.filter)
        return new_subjects, new_groups, added

    async def _join_groups(self, conn: Conn, req: SubscribeRequest) -> None:
        """Shared subscriptions at QoS >= 1 read their group's queue (group_delivery.py): a
        persistent session's always (stored, so routed to the group's queue:
        services/common/group_routes.py), a clean session's while the group is durable (the
        router says whether it is now; before the SUBACK, so nothing arrives twice)."""
        tenant = conn.channel.tenant
        shared = []
        for s, sub_id in req.subscriptions:
            key = split_shared(s.filter)
            if key is not None and s.qos >= 1:
                group = self.subs.shared.get((tenant, *key))
                shared.append((s, (s.qos, (sub_id,) if sub_id else ()), key, group))
        if not shared:
            return
        if conn.persistent is not None:
            for _, (qos, ids), key, group in shared:
                conn.persistent.groups.join(group_queue_id(*key), qos, ids, group, True)
            return
        members, router = self.clean_members, self._router
        if members is None or router is None or conn.channel.persistent:
            return
        try:
            durable = await router.durable_groups(tenant, [s.filter for s, *_ in shared])
        except Exception as exc:  # as if not durable; its first notice says otherwise
            log.warning("durable_groups_failed", extra={"error": type(exc).__name__})
            durable = [False] * len(shared)
        for (_, member, key, group), on in zip(shared, durable, strict=True):
            members.join(conn, group_queue_id(*key), member, group, on)

    async def _slots(self, conn: Conn, req: SubscribeRequest, added: list[str]) -> SubscribeRequest:
        """Ask the tenant's slots for the SUBSCRIBE's new filters; those past the tenant's
        max_tenant_subscriptions leave the node again and are refused (0x97; 3.1.1 0x80)."""
        ch = conn.channel
        if self.slots is None:
            return req
        granted = await self.slots.admit(ch.tenant, len(added))
        if granted >= len(added):
            return req
        over = added[granted:]
        self.on_refused("max_tenant_subscriptions", ch.tenant, len(over))
        self.unsubscribe(conn, over)
        return without(req, set(over), QUOTA_EXCEEDED if ch.level == 5 else SUBSCRIBE_FAILED)

    async def _complete(
        self,
        conn: Conn,
        req: SubscribeRequest,
        new_subjects: list[str],
        new_groups: list[SharedGroup[Conn]],
        persist: bool,
    ) -> SubscribeRequest:
        """Subscribe on NATS and store a persistent session's subscriptions; on failure undo
        them and answer 0x80 for them."""
        try:
            await self._nats_subscribe(conn.channel.tenant, new_subjects, new_groups)
        except Exception:
            log.exception("nats_subscribe_failed")
            self.unsubscribe(conn, tuple(s.filter for s, _ in req.subscriptions))
            return refused(req)
        if not (persist and req.subscriptions and self._router is not None):
            return req
        ch = conn.channel
        try:
            await self._router.subscribe(ch.tenant, ch.client_id, ch.incarnation, req.subscriptions)
        except Exception as exc:
            log.warning("persistent_subscribe_failed", extra={"error": type(exc).__name__})
            self.unsubscribe(conn, tuple(s.filter for s, _ in req.subscriptions))
            return refused(req)
        return req

    async def _nats_subscribe(
        self, tenant: str, new_subjects: list[str], new_groups: list[SharedGroup[Conn]]
    ) -> None:
        for subject in new_subjects:
            # nats-py needs a coroutine function as callback (a lambda is refused).
            async def on_mesh(msg: Msg, subject: str = subject) -> None:
                await self._fanout.on_mesh(msg, subject)

            self._nats_subs[subject] = await self._nc.subscribe(subject, cb=on_mesh)
        for g in new_groups:

            async def on_shared(msg: Msg, g: SharedGroup[Conn] = g) -> None:
                await self._shared.on_message(g, msg)

            for subject in (*g.subjects, redelivery_subject(g)):
                self._nats_subs[f"{g.queue}|{subject}"] = await self._nc_shared.subscribe(
                    subject, queue=g.queue, cb=on_shared
                )
        if new_subjects:
            await flushed(self._nc, 5)
        if new_groups:
            await flushed(self._nc_shared, 5)
        shared = [
            f"{g.queue}|{s}" for g in new_groups for s in (*g.subjects, redelivery_subject(g))
        ]
        keys = [*new_subjects, *shared]
        if keys:
            self._keys.setdefault(tenant, set()).update(keys)
            if shared:
                self._shared_keys.setdefault(tenant, set()).update(shared)
            if self._interest is not None:
                if shared:
                    self._interest.shared(tenant, True)
                # Other nodes publish this tenant's messages before the SUBACK goes out.
                await self._interest.hold(tenant)

    def unsubscribe(
        self, conn: Conn, filters: Sequence[str], persist: bool = False, announce: bool = False
    ) -> None:
        """Remove from the node; `persist`: also from the session's stored subscriptions;
        `announce`: the client's UNSUBSCRIBE (an `unsubscribed` event, when a rule reads it)."""
        ch = conn.channel
        if announce and self.events is not None and filters:
            self._announce(ch, filters, self.events)
        if persist and self._router is not None:
            self._forget(ch, filters, self._router)
        gone: list[str] = []
        held = self.subs.counts.get(ch.tenant, 0)
        for f in filters:
            shared = parse_shared(f, NO_LIMITS)
            if shared is None:
                gone += self.subs.remove(ch.tenant, conn, f)
            else:
                qid = group_queue_id(shared.group, shared.filter)
                if conn.persistent is not None:  # a durable group's member leaves it
                    conn.persistent.groups.leave(qid)
                elif self.clean_members is not None:
                    self.clean_members.leave(conn, qid)
                g = self.subs.remove_shared(ch.tenant, shared.group, conn, shared.filter)
                if g is not None:
                    gone += [f"{g.queue}|{s}" for s in (*g.subjects, redelivery_subject(g))]
        if self.slots is not None and self.subs.counts.get(ch.tenant, 0) < held:
            self.slots.changed(ch.tenant)
        if gone:
            self._ops.put(functools.partial(self._drop, ch.tenant, gone))

    def _announce(self, ch: Channel, filters: Sequence[str], events: SubscriptionEvents) -> None:
        """The `unsubscribed` event, after the SUBSCRIBEs before it."""
        tenant, client_id, user = ch.tenant, ch.client_id, ch.identity.partition("/")[2]

        async def announced() -> None:
            events.unsubscribed(tenant, client_id, user, filters)

        self._ops.put(announced)

    def _forget(self, ch: Channel, filters: Sequence[str], router: RouterClient) -> None:
        """Remove `filters` from the session's stored subscriptions, in order."""
        tenant, client_id, incarnation = ch.tenant, ch.client_id, ch.incarnation

        async def forget() -> None:
            try:
                await router.unsubscribe(tenant, client_id, incarnation, list(filters))
            except Exception as exc:
                log.warning("persistent_unsubscribe_failed", extra={"error": type(exc).__name__})

        self._ops.put(forget)

    async def _drop(self, tenant: str, gone: list[str]) -> None:
        """Unsubscribe on NATS the subjects (`gone`) no client of this node needs any more;
        the mesh's interest follows what the tenant still holds."""
        held = self._keys.get(tenant, set())
        for key in gone:
            held.discard(key)
            sub = self._nats_subs.pop(key, None)
            if sub is not None:
                await sub.unsubscribe()
        shared = self._shared_keys.get(tenant, set())
        shared.difference_update(gone)
        if not shared:
            self._shared_keys.pop(tenant, None)
            if self._interest is not None:
                self._interest.shared(tenant, False)
        if not held:
            self._keys.pop(tenant, None)
            if self._interest is not None:
                self._interest.release(tenant)

    async def on_routes(self, msg: Msg) -> None:
        """The router's ListRoutes asks every node which filters its clients hold."""
        tenant = msg.data.decode()
        trie = self.subs.tries.get(tenant)
        filters = sorted({f for f, _, _ in trie.items()}) if trie is not None else []
        filters += sorted(
            {
                f"$share/{g.group}/{g.filter}"
                for (t, _, _), g in self.subs.shared.items()
                if t == tenant
            }
        )
        reply = router_pb2.ListRoutesResponse(
            routes=[router_pb2.Route(topic_filter=f, node_ids=[self._node_id]) for f in filters]
        )
        if msg.reply:
            await self._nc.publish(msg.reply, reply.SerializeToString())

    async def listen_for_route_listings(self) -> None:
        await self._nc.subscribe(subjects.ROUTE_LISTING, cb=self.on_routes)
