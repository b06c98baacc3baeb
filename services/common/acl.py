"""ACL rules and their evaluation, shared by the session service (which stores and returns
them) and connection nodes (which enforce them per message without a remote call).

Rules are evaluated in order; the first rule whose action and topic match decides; otherwise
the default applies. For SUBSCRIBE an allow rule must cover the whole requested filter, and a
deny rule applies when the requested filter overlaps it (so `#` cannot sneak past a deny).
A publish is checked on its effective topic: `$delayed/10/a/b` as `a/b`, so a delay cannot
carry a message where its sender may not publish.

`%u` and `%c` stand for the user name and client id, which the client chooses. A value with a
wildcard or a level separator (`+`, `#`, `/`) would widen the rule (`devices/%c/#` with the id
`#` is `devices/#`), so an allow rule is dropped for such a client, while a deny rule keeps the
value (a wider deny only refuses more). An empty value is treated the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from services.common.topics.delayed import effective_topic

_UNSAFE_IN_TEMPLATE = frozenset("+#/")


class Access(IntEnum):
    PUBLISH = 1
    SUBSCRIBE = 2
    ALL = 3


@dataclass(frozen=True, slots=True)
class AclRule:
    allow: bool
    access: Access
    topic_filter: str
    username: str = ""  # empty: any user
    client_id: str = ""  # empty: any client

    def applies_to(self, username: str, client_id: str) -> bool:
        return (not self.username or self.username == username) and (
            not self.client_id or self.client_id == client_id
        )


def _safe_value(value: str) -> bool:
    return bool(value) and _UNSAFE_IN_TEMPLATE.isdisjoint(value)


def substitute(rules: list[AclRule], username: str, client_id: str) -> list[AclRule]:
    """Keep the rules for this client and replace %u / %c in their filters (see the module
    docstring for values that cannot be substituted into an allow rule)."""
    out = []
    for r in rules:
        if not r.applies_to(username, client_id):
            continue
        filt = r.topic_filter
        if r.allow and (
            ("%u" in filt and not _safe_value(username))
            or ("%c" in filt and not _safe_value(client_id))
        ):
            continue
        filt = filt.replace("%u", username).replace("%c", client_id)
        out.append(AclRule(r.allow, r.access, filt))
    return out


def _match(filt: list[str], topic: list[str]) -> bool:
    for i, f in enumerate(filt):
        if f == "#":
            return True
        if i >= len(topic) or (f != "+" and f != topic[i]):
            return False
    return len(filt) == len(topic)


def filter_covers(rule: str, requested: str) -> bool:
    """True when every topic `requested` matches is matched by `rule`."""
    r, q = rule.split("/"), requested.split("/")
    for i, f in enumerate(r):
        if f == "#":
            return True
        if i >= len(q) or q[i] == "#":
            return False
        if f != "+" and (q[i] == "+" or f != q[i]):
            return False
    return len(r) == len(q)


def filters_overlap(a: str, b: str) -> bool:
    """True when some topic matches both filters."""
    x, y = a.split("/"), b.split("/")
    for i in range(max(len(x), len(y))):
        if i >= len(x) or i >= len(y):
            # `a/#` also matches `a`: a trailing '#' may match nothing.
            rest = x[i:] if i < len(x) else y[i:]
            return rest == ["#"]
        if x[i] == "#" or y[i] == "#":
            return True
        if x[i] != "+" and y[i] != "+" and x[i] != y[i]:
            return False
    return True


ACL_CACHE_ENTRIES = 4096  # publish topics a connection's ACL answers are kept for, at most
ACL_CACHE_CHARS = 128 << 10  # and their total length
ACL_CACHE_TOPIC_CHARS = 512  # a longer topic is checked each time, not kept


class AclChecker:
    """Per-connection ACL evaluation with a small cache for publish topics."""

    __slots__ = ("_cache", "_cached_chars", "_default", "_pub", "_sub")

    def __init__(self, rules: list[AclRule], default_allow: bool) -> None:
        self._default = default_allow
        self._pub = [(r.allow, r.topic_filter.split("/")) for r in rules if r.access & 1]
        self._sub = [(r.allow, r.topic_filter) for r in rules if r.access & 2]
        self._cache: dict[str, bool] = {}
        self._cached_chars = 0

    def can_publish(self, topic: str) -> bool:
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        result = self._check_publish(effective_topic(topic) if topic[:1] == "$" else topic)
        # Bounded in entries and in the topics' size (every connection has one: a client
        # publishing to thousands of long topics must not make it megabytes).
        if len(topic) > ACL_CACHE_TOPIC_CHARS:
            return result
        if len(self._cache) >= ACL_CACHE_ENTRIES or self._cached_chars > ACL_CACHE_CHARS:
            self._cache.clear()
            self._cached_chars = 0
        self._cache[topic] = result
        self._cached_chars += len(topic)
        return result

    def _check_publish(self, topic: str) -> bool:
        levels = topic.split("/")
        result = self._default
        for allow, filt in self._pub:
            if _match(filt, levels) and not (topic[:1] == "$" and filt[0] in ("+", "#")):
                result = allow
                break
        return result

    def can_subscribe(self, filt: str) -> bool:
        for allow, rule in self._sub:
            if allow and filter_covers(rule, filt):
                return True
            if not allow and filters_overlap(rule, filt):
                return False
        return self._default
