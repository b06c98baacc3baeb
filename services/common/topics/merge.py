"""Overlapping subscriptions of one client: one delivery, merged [MQTT-3.3.4-2].

When several of a client's subscriptions match a message, the client receives it once, at the
highest QoS those subscriptions grant (capped by the publish QoS), with retain-as-published if
any of them asks for it and with every subscription identifier [MQTT-3.3.4-3]. A no-local
subscription never grants the publisher its own message [MQTT-3.8.3-3]. The connection node
(live deliveries) and the router (persistent queues) both merge with this one function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

K = TypeVar("K")


class Granting(Protocol):
    """What a subscription contributes to a merge (a node's entry or a stored record)."""

    @property
    def qos(self) -> int: ...

    @property
    def no_local(self) -> bool: ...

    @property
    def retain_as_published(self) -> bool: ...

    @property
    def sub_ids(self) -> tuple[int, ...]: ...


# (delivery QoS, retain flag on delivery, subscription identifiers)
Grant = tuple[int, bool, tuple[int, ...]]


def merge_matches(
    matches: Iterable[tuple[K, Granting]],
    qos: int,
    retain: bool,
    publisher: str,
    client_of: Callable[[K], str],
) -> dict[K, Grant]:
    """Per client key, the one delivery its matching subscriptions grant for a message
    published at `qos` with `retain` by client id `publisher`."""
    out: dict[K, Grant] = {}
    # Identifiers of clients matched more than once, gathered in a list: adding tuples would
    # copy them per match, quadratic in a client's overlapping subscriptions.
    more_ids: dict[K, list[int]] = {}
    for key, sub in matches:
        if sub.no_local and client_of(key) == publisher:
            continue
        q = sub.qos if sub.qos < qos else qos
        rap = retain and sub.retain_as_published
        prev = out.get(key)
        if prev is None:
            out[key] = (q, rap, sub.sub_ids)
            continue
        out[key] = (max(prev[0], q), prev[1] or rap, prev[2])
        if sub.sub_ids:
            ids = more_ids.get(key)
            if ids is None:
                ids = more_ids[key] = list(prev[2])
            ids += sub.sub_ids
    for key, ids in more_ids.items():
        q, rap, _ = out[key]
        out[key] = (q, rap, tuple(ids))
    return out
