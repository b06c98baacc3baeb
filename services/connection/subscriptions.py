"""A node's view of its clients' subscriptions: one trie per tenant, NATS subjects with
reference counts, and shared-subscription groups.

Theory of operation: the node subscribes to the NATS subjects of the union of its clients'
filters; when two filters overlap (`a/#` and `a/+`), NATS sends the message once per matching
subject. `should_process` makes the node act on exactly one copy: the one that arrived on the
smallest subject among those its matching filters map to. Shared subscriptions use NATS queue
groups, one per (tenant, group, filter), so each message reaches one node and then one member.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from services.common.bus.subjects import shared_group
from services.common.topics import TopicTrie, filter_to_subjects

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class SubEntry:
    filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    sub_ids: tuple[int, ...]
    subjects: tuple[str, ...]


def subject_for(entry: SubEntry, subject: str) -> str:
    """Which of the entry's subjects received `subject` (`a` vs `a.>` for `a/#`)."""
    subs = entry.subjects
    if len(subs) == 1:
        return subs[0]
    return subs[0] if subject.count(".") == subs[0].count(".") else subs[1]


@dataclass(slots=True)
class SharedGroup(Generic[C]):
    tenant: str
    group: str
    filter: str
    queue: str
    subjects: tuple[str, ...]
    members: dict[C, SubEntry] = field(default_factory=dict)
    turn: int = 0
    # A durable group (persistent members: it owns a queue): its members at QoS >= 1 take
    # its QoS >= 1 messages from that queue, not from NATS (connection/group_delivery.py).
    durable: bool = False


def redelivery_subject(group: SharedGroup[Any]) -> str:
    """Where a group's unacknowledged messages go when a member leaves; members subscribe
    with the group's queue name, so exactly one remaining member gets each."""
    return f"re.{group.queue}"


class NodeSubscriptions(Generic[C]):
    def __init__(self) -> None:
        self.tries: dict[str, TopicTrie[C, SubEntry]] = {}
        self.subject_refs: dict[str, int] = {}
        self.shared: dict[tuple[str, str, str], SharedGroup[C]] = {}
        # tenant -> (client, filter) pairs held, plain and shared: the node's figure in the
        # tenant's subscription count (services/common/subscription_counts.py)
        self.counts: dict[str, int] = {}

    def _count(self, tenant: str, n: int) -> None:
        left = self.counts.get(tenant, 0) + n
        if left > 0:
            self.counts[tenant] = left
        else:
            self.counts.pop(tenant, None)

    def add(self, tenant: str, client: C, entry: SubEntry) -> list[str]:
        """Add or replace; return subjects that now need a NATS subscription."""
        trie = self.tries.get(tenant)
        if trie is None:
            trie = self.tries[tenant] = TopicTrie()
        old = trie.get(entry.filter, client)
        trie.add(entry.filter, client, entry)
        if old is not None:
            return []
        self._count(tenant, 1)
        new = []
        for s in entry.subjects:
            n = self.subject_refs.get(s, 0)
            self.subject_refs[s] = n + 1
            if n == 0:
                new.append(s)
        return new

    def remove(self, tenant: str, client: C, filt: str) -> list[str]:
        """Remove; return subjects no longer needed."""
        trie = self.tries.get(tenant)
        if trie is None:
            return []
        entry = trie.get(filt, client)
        if entry is None or not trie.remove(filt, client):
            return []
        self._count(tenant, -1)
        if not len(trie):
            del self.tries[tenant]
        gone = []
        for s in entry.subjects:
            n = self.subject_refs[s] - 1
            if n:
                self.subject_refs[s] = n
            else:
                del self.subject_refs[s]
                gone.append(s)
        return gone

    def add_shared(
        self, tenant: str, group: str, client: C, entry: SubEntry
    ) -> SharedGroup[C] | None:
        """Add a member; return the group when it is new on this node (needs NATS subs)."""
        key = (tenant, group, entry.filter)
        g = self.shared.get(key)
        created = g is None
        if g is None:
            digest = hashlib.sha1(entry.filter.encode()).hexdigest()[:16]
            g = self.shared[key] = SharedGroup(
                tenant,
                group,
                entry.filter,
                f"{shared_group(tenant, group)}.{digest}",
                entry.subjects,
            )
        if client not in g.members:
            self._count(tenant, 1)
        g.members[client] = entry
        return g if created else None

    def remove_shared(self, tenant: str, group: str, client: C, filt: str) -> SharedGroup[C] | None:
        """Remove a member; return the group when it became empty (drop its NATS subs)."""
        g = self.shared.get((tenant, group, filt))
        if g is None or g.members.pop(client, None) is None:
            return None
        self._count(tenant, -1)
        if g.members:
            return None
        del self.shared[(tenant, group, filt)]
        return g


def should_process(
    received_on: str, subject: str, matches: Sequence[tuple[object, SubEntry]]
) -> bool:
    """True for exactly one of the copies NATS delivered for overlapping subscriptions."""
    first = matches[0][1].subjects
    if all(e.subjects is first or e.subjects == first for _, e in matches):
        return True if len(first) == 1 else subject_for(matches[0][1], subject) == received_on
    return received_on == min(subject_for(e, subject) for _, e in matches)


def entry_for(
    filt: str, tenant: str, qos: int, no_local: bool, rap: bool, sub_id: int | None
) -> SubEntry:
    return SubEntry(
        filt, qos, no_local, rap, (sub_id,) if sub_id else (), filter_to_subjects(tenant, filt)
    )
