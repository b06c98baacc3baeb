"""The persistent route table: pure matching of topics to session queues."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from services.common.store.ports import SubscriptionRecord
from services.common.topics import TopicTrie
from services.common.topics.merge import merge_matches

SessionKey = tuple[str, int]  # (client_id, incarnation)


class RouteResult(IntEnum):
    """What the router did with one publish (values of `starling.router.v1.RouteResult`).

    The node acknowledges the publisher (PUBACK/PUBREC) only after STORED, NO_MATCH or
    QUOTA_EXCEEDED (with 0x97); TRY_LATER means a queue could not take it: keep it and retry.
    """

    STORED = 1  # held (delayed, will) or appended to every matching session's queue
    NO_MATCH = 2  # no persistent session subscribes to it
    TRY_LATER = 3
    QUOTA_EXCEEDED = 4  # the tenant's retained-message cap refused it (it was still routed)


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


class RouteTable:
    def __init__(self) -> None:
        self._tries: dict[str, TopicTrie[SessionKey, SubscriptionRecord]] = {}
        self._filters: dict[tuple[str, str, int], set[str]] = {}

    def __len__(self) -> int:
        return sum(len(t) for t in self._tries.values())

    def add(self, rec: SubscriptionRecord) -> None:
        trie = self._tries.setdefault(rec.tenant, TopicTrie())
        trie.add(rec.topic_filter, (rec.client_id, rec.incarnation), rec)
        self._filters.setdefault((rec.tenant, rec.client_id, rec.incarnation), set()).add(
            rec.topic_filter
        )

    def remove(self, tenant: str, client_id: str, incarnation: int, filt: str) -> None:
        trie = self._tries.get(tenant)
        if trie is not None:
            trie.remove(filt, (client_id, incarnation))
        self._filters.get((tenant, client_id, incarnation), set()).discard(filt)

    def drop(self, tenant: str, client_id: str, incarnation: int) -> None:
        for f in self._filters.pop((tenant, client_id, incarnation), set()):
            self.remove(tenant, client_id, incarnation, f)

    def routes(self, tenant: str) -> dict[str, list[str]]:
        """Persistent filters of a tenant and the sessions (client#incarnation) behind them."""
        out: dict[str, list[str]] = {}
        for (t, client_id, incarnation), filters in self._filters.items():
            if t != tenant:
                continue
            for f in filters:
                out.setdefault(f, []).append(f"{client_id}#{incarnation}")
        return out

    def subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[SubscriptionRecord]:
        trie = self._tries.get(tenant)
        filters = sorted(self._filters.get((tenant, client_id, incarnation), set()))
        if trie is None:
            return []
        out = [trie.get(f, (client_id, incarnation)) for f in filters]
        return [r for r in out if r is not None]

    def targets(
        self,
        tenant: str,
        topic: str,
        qos: int,
        retain: bool,
        publisher: str,
        include_qos0: bool = False,
    ) -> list[Target]:
        """Queues for one message: per session the highest QoS of its matching
        subscriptions [MQTT-3.3.4-2] and all their identifiers; no-local honoured."""
        trie = self._tries.get(tenant)
        if trie is None:
            return []
        per = merge_matches(trie.match(topic), qos, retain, publisher, _client_of)
        return [
            Target(k[0], k[1], q, rap, ids)
            for k, (q, rap, ids) in per.items()
            if q > 0 or include_qos0
        ]
