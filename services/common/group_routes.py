"""Durable shared groups in the persistent route table: which persistent sessions hold a
`$share/<group>/<filter>` subscription, and the one route per (group, filter) whose target is
the group's own queue (`group_queue_id`).

Theory of operation: a persistent session's shared subscription is stored with the others
(its filter starts with `$share/`, so it never matches a topic itself). Beside it, this index
keeps, per tenant, the members of each (group, filter) and a trie of the inner filters whose
value grants the highest QoS of any member: a publish that matches it gets ONE entry, in the
group's queue, whichever members are connected; the queue service hands the entries to the
members (services/queue/groups.py). The index is derived from the subscriptions alone, so the
router and the nodes' copies (services/connection/replica.py) build the same one from the
same changes and snapshots. The route goes with the group's last member.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from services.common.topics import TopicTrie
from services.common.topics.share import SHARE_PREFIX

SessionKey = tuple[str, int]  # (client_id, incarnation)
GroupKey = tuple[str, str]  # (group, inner filter)
# The incarnation a group's route carries in the trie's key: no session has it.
GROUP_INCARNATION = -1


def group_queue_id(group: str, filt: str) -> str:
    """The queue of a durable shared group: `$share/<group>/<digest of the filter>`. A
    session's queue id is `client#incarnation`; this one has no `#`, so never the same."""
    digest = hashlib.sha1(filt.encode()).hexdigest()[:16]
    return f"{SHARE_PREFIX}{group}/{digest}"


def is_group_queue(queue_id: str) -> bool:
    return queue_id.startswith(SHARE_PREFIX) and "#" not in queue_id


def split_shared(filt: str) -> GroupKey | None:
    """(group, inner filter) of a stored `$share/<group>/<filter>`, None for a plain one."""
    if not filt.startswith(SHARE_PREFIX):
        return None
    group, sep, inner = filt[len(SHARE_PREFIX) :].partition("/")
    return (group, inner) if group and sep and inner else None


class GroupRoutes:
    """Per tenant: members of each durable group and the trie of the groups' routes (key
    (group queue id, GROUP_INCARNATION), value the highest QoS of the members)."""

    def __init__(self) -> None:
        self._members: dict[str, dict[GroupKey, dict[SessionKey, int]]] = {}
        self._tries: dict[str, TopicTrie[SessionKey, int]] = {}

    def joined(self, tenant: str, filt: str, session: SessionKey, qos: int) -> bool:
        """A session holds `filt` (any filter); True if it is a shared one."""
        key = split_shared(filt)
        if key is None:
            return False
        members = self._members.setdefault(tenant, {}).setdefault(key, {})
        members[session] = qos
        self._route(tenant, key, members)
        return True

    def left(self, tenant: str, filt: str, session: SessionKey) -> bool:
        """A session no longer holds `filt`; True if it was a shared one."""
        key = split_shared(filt)
        if key is None:
            return False
        groups = self._members.get(tenant, {})
        members = groups.get(key)
        if members is not None and members.pop(session, None) is not None:
            if not members:
                del groups[key]
            self._route(tenant, key, members)
        return True

    def _route(self, tenant: str, key: GroupKey, members: dict[SessionKey, int]) -> None:
        trie = self._tries.setdefault(tenant, TopicTrie())
        target = (group_queue_id(*key), GROUP_INCARNATION)
        if members:
            trie.add(key[1], target, max(members.values()))
        else:
            trie.remove(key[1], target)
            if not len(trie):
                del self._tries[tenant]
                self._members.pop(tenant, None)

    def forget(self, tenant: str) -> None:
        self._members.pop(tenant, None)
        self._tries.pop(tenant, None)

    def clear(self) -> None:
        self._members.clear()
        self._tries.clear()

    def members(self, tenant: str, filt: str) -> int:
        """Members of the durable group of a stored `$share/...` filter."""
        key = split_shared(filt)
        return len(self._members.get(tenant, {}).get(key, ())) if key is not None else 0

    def match(self, tenant: str, topic: str) -> Iterator[tuple[str, int]]:
        """(group queue id, granted QoS) of every group route matching `topic`."""
        trie = self._tries.get(tenant)
        if trie is None:
            return
        for (qid, _), qos in trie.match(topic):
            yield qid, qos
