"""The persistent route table: pure matching of topics to session queues, and what a
batch of publishes makes of it (`plan`: queue entries; `settle`: results). The router
service (services/router/) and the connection nodes' copies of the table
(services/connection/replica.py) share this code; so does RouteResult, what a publish
through the router came to (services/router/client.py, services/common/bus/publisher.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from services.common.group_routes import GROUP_INCARNATION, GroupRoutes
from services.common.queue_entries import AppendResult, NewEntry, queue_id
from services.common.store.ports_session import SubscriptionRecord
from services.common.topics import TopicTrie
from services.common.topics.merge import merge_matches
from services.common.topics.share import SHARE_PREFIX
from starling.common.v1.message_pb2 import RoutedMessage

SessionKey = tuple[str, int]  # (client_id, incarnation)


class RouteResult(IntEnum):
    """What the router did with one publish (values of `starling.router.v1.RouteResult`).

    The node acknowledges the publisher (PUBACK/PUBREC) only after STORED, NO_MATCH,
    QUOTA_EXCEEDED or QUEUE_QUOTA_EXCEEDED (with 0x97); TRY_LATER means a queue could not
    take it: keep it and retry.
    """

    STORED = 1  # held (delayed, will) or appended to every matching session's queue
    NO_MATCH = 2  # no persistent session subscribes to it
    TRY_LATER = 3
    QUOTA_EXCEEDED = 4  # the tenant's retained-message cap refused it (it was still routed)
    # A matching session's queue refused it (the tenant's max_queue_depth); the others took
    # it. The publisher is told (MQTT 5: 0x97; 3.1.1: the connection closes unacknowledged).
    QUEUE_QUOTA_EXCEEDED = 5

    @property
    def kept(self) -> bool:
        """Every persistent subscriber has it (or there is none): nothing to send again.
        What services publish through the router (services/common/bus/publisher.py) asks."""
        return self is RouteResult.STORED or self is RouteResult.NO_MATCH


@dataclass(frozen=True, slots=True)
class Target:
    """One queue a message goes to, at the QoS it is delivered with."""

    client_id: str
    incarnation: int
    qos: int
    retain: bool
    subscription_ids: tuple[int, ...]


def _client_of(key: SessionKey) -> str:
    return key[0]


class RouteGrant(NamedTuple):
    """What the table keeps per subscription (the rest of the record is its place in the
    table): a tuple, so a snapshot makes a million of them without a Python call each, and
    equal ones without an identifier are shared."""

    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int
    sub_ids: tuple[int, ...]

    @classmethod
    def of(cls, rec: SubscriptionRecord) -> RouteGrant:
        g = cls(
            rec.qos,
            rec.no_local,
            rec.retain_as_published,
            rec.retain_handling,
            rec.subscription_identifier,
            rec.sub_ids,
        )
        return _SHARED.setdefault(g, g) if not rec.subscription_identifier else g


# Grants without an identifier: at most 3 x 2 x 2 x 3 of them.
_SHARED: dict[RouteGrant, RouteGrant] = {}

# One tenant's sessions and the filters each holds (the trie answers the other way round).
SessionFilters = dict[SessionKey, set[str]]

# Answers of `targets` kept, over all tenants: a device fleet publishes to the same topics
# over and over, and a cached answer costs a dict look-up instead of a trie walk, a merge and
# a Target per queue (about 2.5 of the ~5 us per persistent message the plan took). Past the
# bound the cache starts over: memory stays bounded whatever topics clients publish to.
TARGETS_CACHED = 10_000
_TargetsKey = tuple[str, int, bool, str, bool]  # topic, qos, retain, publisher, include_qos0


class RouteTable:
    def __init__(self) -> None:
        self._tries: dict[str, TopicTrie[SessionKey, RouteGrant]] = {}
        self._sessions: dict[str, SessionFilters] = {}
        # Tenants loaded from a snapshot whose session filters are made on first use: only
        # a change or a listing needs them, a publish never does (a faster boot).
        self._unmade: dict[str, Callable[[], SessionFilters]] = {}
        # Per tenant, `targets` answers since the tenant's last change (TARGETS_CACHED).
        self._targets: dict[str, dict[_TargetsKey, tuple[Target, ...]]] = {}
        self._targets_cached = 0
        # Durable shared groups: one route per (group, filter) to the group's queue.
        self.groups = GroupRoutes()

    def _changed(self, tenant: str) -> None:
        """The tenant's subscriptions changed: its cached answers are void."""
        cached = self._targets.pop(tenant, None)
        if cached is not None:
            self._targets_cached -= len(cached)

    def __len__(self) -> int:
        return sum(len(t) for t in self._tries.values())

    def routes_any(self, tenant: str) -> bool:
        """Whether some persistent session of `tenant` subscribes to anything."""
        trie = self._tries.get(tenant)
        return trie is not None and len(trie) > 0

    def _sessions_of(self, tenant: str) -> SessionFilters:
        sessions = self._sessions.get(tenant)
        if sessions is None:
            make = self._unmade.pop(tenant, None)
            sessions = self._sessions[tenant] = {} if make is None else make()
        return sessions

    def add(self, rec: SubscriptionRecord) -> None:
        self._changed(rec.tenant)
        trie = self._tries.setdefault(rec.tenant, TopicTrie())
        key = (rec.client_id, rec.incarnation)
        trie.add(rec.topic_filter, key, RouteGrant.of(rec))
        self._sessions_of(rec.tenant).setdefault(key, set()).add(rec.topic_filter)
        self.groups.joined(rec.tenant, rec.topic_filter, key, rec.qos)

    def remove(self, tenant: str, client_id: str, incarnation: int, filt: str) -> None:
        self._changed(tenant)
        trie = self._tries.get(tenant)
        if trie is not None:
            trie.remove(filt, (client_id, incarnation))
        self._sessions_of(tenant).get((client_id, incarnation), set()).discard(filt)
        self.groups.left(tenant, filt, (client_id, incarnation))

    def drop(self, tenant: str, client_id: str, incarnation: int) -> None:
        for f in self._sessions_of(tenant).pop((client_id, incarnation), set()):
            self.remove(tenant, client_id, incarnation, f)

    def clear(self) -> None:
        self._targets.clear()
        self._targets_cached = 0
        self._tries.clear()
        self._sessions.clear()
        self._unmade.clear()
        self.groups.clear()

    def tenants(self) -> list[str]:
        return list(self._tries)

    def trie(self, tenant: str) -> TopicTrie[SessionKey, RouteGrant] | None:
        """The tenant's trie (for a snapshot of it: services/router/snapshot.py)."""
        return self._tries.get(tenant)

    def adopt(
        self,
        tenant: str,
        trie: TopicTrie[SessionKey, RouteGrant],
        sessions: SessionFilters | Callable[[], SessionFilters],
    ) -> None:
        """Take a tenant's trie and its sessions' filters (or what makes them, called on
        first use) as loaded from a snapshot, in place of whatever the table held for it."""
        self._changed(tenant)
        self._tries[tenant] = trie
        self.groups.forget(tenant)
        if trie.count_under(SHARE_PREFIX.rstrip("/")):  # durable groups: their routes
            for f, key, grant in trie.items():
                self.groups.joined(tenant, f, key, grant.qos)
        self._sessions.pop(tenant, None)
        self._unmade.pop(tenant, None)
        if callable(sessions):
            self._unmade[tenant] = sessions
        else:
            self._sessions[tenant] = sessions

    def session_filters(self, tenant: str) -> list[tuple[SessionKey, set[str]]]:
        """Each session of the tenant with its filters."""
        return [(k, f) for k, f in self._sessions_of(tenant).items() if f]

    def sessions_by_tenant(self) -> dict[str, int]:
        """Sessions with at least one subscription, per tenant (a walk over every session:
        for the periodic stats report, not for a request path). A tenant loaded from a
        snapshot whose session index was not needed yet is left out rather than built here
        (that would undo the fast boot for a figure)."""
        return {
            tenant: sum(1 for filters in sessions.values() if filters)
            for tenant, sessions in list(self._sessions.items())
            if sessions
        }

    def count(self, tenant: str) -> int:
        """Subscriptions of one tenant."""
        trie = self._tries.get(tenant)
        return 0 if trie is None else len(trie)

    def count_shared(self, tenant: str) -> int:
        """Of `count`, the shared subscriptions (`$share/<group>/<filter>`)."""
        trie = self._tries.get(tenant)
        return 0 if trie is None else trie.count_under(SHARE_PREFIX.rstrip("/"))

    def records(self, tenant: str) -> list[SubscriptionRecord]:
        """Every subscription of one tenant."""
        out: list[SubscriptionRecord] = []
        for client_id, incarnation in self._sessions_of(tenant):
            out += self.subscriptions(tenant, client_id, incarnation)
        return out

    def routes(self, tenant: str) -> dict[str, list[str]]:
        """Persistent filters of a tenant and the sessions (client#incarnation) behind them."""
        out: dict[str, list[str]] = {}
        for (client_id, incarnation), filters in self._sessions_of(tenant).items():
            for f in filters:
                out.setdefault(f, []).append(f"{client_id}#{incarnation}")
        return out

    def subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[SubscriptionRecord]:
        trie = self._tries.get(tenant)
        if trie is None:
            return []
        filters = sorted(self._sessions_of(tenant).get((client_id, incarnation), set()))
        out: list[SubscriptionRecord] = []
        for f in filters:
            g = trie.get(f, (client_id, incarnation))
            if g is not None:
                out.append(
                    SubscriptionRecord(
                        tenant,
                        client_id,
                        incarnation,
                        f,
                        g.qos,
                        g.no_local,
                        g.retain_as_published,
                        g.retain_handling,
                        g.subscription_identifier,
                    )
                )
        return out

    def targets(
        self,
        tenant: str,
        topic: str,
        qos: int,
        retain: bool,
        publisher: str,
        include_qos0: bool = False,
    ) -> tuple[Target, ...]:
        """Queues for one message: per session the highest QoS of its matching
        subscriptions [MQTT-3.3.4-2] and all their identifiers; no-local honoured."""
        key = (topic, qos, retain, publisher, include_qos0)
        cached = self._targets.get(tenant)
        if cached is not None:
            hit = cached.get(key)
            if hit is not None:
                return hit
        trie = self._tries.get(tenant)
        if trie is None:
            return ()
        per = merge_matches(trie.match(topic), qos, retain, publisher, _client_of)
        found = tuple(
            Target(k[0], k[1], q, rap, ids)
            for k, (q, rap, ids) in per.items()
            if q > 0 or include_qos0
        ) + tuple(
            Target(qid, GROUP_INCARNATION, min(qos, granted), False, ())
            for qid, granted in self.groups.match(tenant, topic)
            if min(qos, granted) > 0 or include_qos0
        )
        if self._targets_cached >= TARGETS_CACHED:
            self._targets.clear()
            self._targets_cached = 0
        self._targets.setdefault(tenant, {})[key] = found
        self._targets_cached += 1
        return found


# Settled for the publisher: stored, or refused for good by the depth limit (counted there).
_SETTLED = {AppendResult.OK, AppendResult.QUEUE_FULL}


def plan(
    table: RouteTable, items: Iterable[tuple[int, RoutedMessage]], include_qos0: bool
) -> dict[str, tuple[list[NewEntry], list[int]]]:
    """Per tenant, the queue entries of `items` (index, message) and, for each entry, the
    index of the message it came from."""
    by_tenant: dict[str, tuple[list[NewEntry], list[int]]] = {}
    for i, m in items:
        for t in table.targets(
            m.tenant, m.topic, m.qos, m.retain, m.publisher.client_id, include_qos0
        ):
            entries, owners = by_tenant.setdefault(m.tenant, ([], []))
            # A durable shared group's route names its queue (services/common/group_routes.py)
            qid = (
                t.client_id
                if t.incarnation == GROUP_INCARNATION
                else queue_id(t.client_id, t.incarnation)
            )
            entries.append(NewEntry(qid, m, t.qos, t.retain, t.subscription_ids))
            owners.append(i)
    return by_tenant


def settle(
    results: list[RouteResult],
    owners: Sequence[int],
    outcomes: Sequence[AppendResult | None],
) -> None:
    """Fold the appends' outcomes into the messages' results (None: not known to be
    stored): a message is STORED once every entry of it is, TRY_LATER if any is not."""
    for i, outcome in zip(owners, outcomes, strict=True):
        if outcome is AppendResult.QUOTA_EXCEEDED:
            if results[i] is not RouteResult.TRY_LATER:
                results[i] = RouteResult.QUEUE_QUOTA_EXCEEDED
        elif outcome not in _SETTLED:
            results[i] = RouteResult.TRY_LATER
        elif results[i] is RouteResult.NO_MATCH:
            results[i] = RouteResult.STORED
