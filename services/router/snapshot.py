"""The routing snapshot's format: one tenant's persistent route table as compact columns
that load in bulk, with no pickle (nothing in it can run code) and no per-subscription
parsing.

A tenant's snapshot is marshal data (flat lists of strings and packed integer arrays),
zlib-compressed and cut into parts of at most PART_BYTES (Cassandra cells stay small). It
holds the table's trie breadth first (each node's level and its numbers of children and
subscribers, services/common/topics/trie.py), the subscribers as (session, grant) indices
with the sessions and the distinct grants listed once, and each session's filters as
indices. Loading makes every node, dict and key with `map` in C and runs no bytecode per
node or subscription: that, not the I/O, is what a boot spends its time on (about 1 µs per
subscription against 6-15 µs for adding them one by one, docs/analytics.md).
"""

from __future__ import annotations

import marshal
import zlib
from array import array
from collections.abc import Callable
from itertools import islice, repeat
from typing import Any

from services.common.route_table import RouteGrant, RouteTable, SessionFilters, SessionKey
from services.common.topics.trie import TopicTrie

FORMAT = 2  # 1: the trie as (level, parent) per node, subscribers per subscription
PART_BYTES = 1 << 20
_LEVEL = 1  # zlib: most of the size win for a fraction of the time of the higher levels


class SnapshotFormatError(ValueError):
    """A part is not a snapshot this code reads."""


def _ints(values: list[int]) -> bytes:
    return array("q", values).tobytes()


def _array(data: bytes) -> array[int]:
    a = array("q")
    a.frombytes(data)
    return a


def _list(data: bytes) -> list[int]:
    return _array(data).tolist()


def encode_tenant(table: RouteTable, tenant: str) -> tuple[int, list[bytes]]:
    """The tenant's subscription count and its snapshot parts."""
    trie = table.trie(tenant)
    if trie is None:
        return 0, []
    levels, child_counts, sub_counts, members = trie.columns()
    sessions = table.session_filters(tenant)
    # Sessions are listed once; a subscriber is the index of its session, so loading makes
    # one (client id, incarnation) key per session, shared by all its subscriptions.
    session_index = {key: n for n, (key, _) in enumerate(sessions)}
    keys = [key for key, _ in sessions]
    for key, _ in members:  # never expected: a subscriber without a session entry
        if key not in session_index:
            session_index[key] = len(keys)
            keys.append(key)
    grants: dict[RouteGrant, int] = {}
    grant_index = [grants.setdefault(g, len(grants)) for _, g in members]
    filter_index: dict[str, int] = {}
    s_filters: list[int] = []
    for _, filters in sessions:
        s_filters += [filter_index.setdefault(f, len(filter_index)) for f in filters]
    doc = (
        FORMAT,
        levels,
        _ints(child_counts),
        _ints(sub_counts),
        [tuple(g[:5]) for g in grants],
        _ints([session_index[k] for k, _ in members]),
        _ints(grant_index),
        [k[0] for k in keys],
        _ints([k[1] for k in keys]),
        list(filter_index),
        _ints([len(f) for _, f in sessions] + [0] * (len(keys) - len(sessions))),
        _ints(s_filters),
    )
    blob = zlib.compress(marshal.dumps(doc), _LEVEL)
    parts = [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [b""]
    return len(members), parts


def decode_tenant(
    tenant: str, parts: list[bytes]
) -> tuple[TopicTrie[SessionKey, RouteGrant], Callable[[], SessionFilters]]:
    """The trie `encode_tenant` wrote, and what makes its session filters (for
    `RouteTable.adopt`, which makes them on first use)."""
    try:
        doc = marshal.loads(zlib.decompress(b"".join(parts)))
        fmt = doc[0]
    except (ValueError, EOFError, TypeError, IndexError, zlib.error) as exc:
        raise SnapshotFormatError(f"snapshot of {tenant!r} does not decode: {exc}") from exc
    if fmt != FORMAT:
        raise SnapshotFormatError(f"snapshot of {tenant!r} has format {fmt}, not {FORMAT}")
    try:
        return _columns_to_table(doc)
    except (ValueError, TypeError, IndexError) as exc:
        raise SnapshotFormatError(f"snapshot of {tenant!r} is damaged: {exc}") from exc


def _columns_to_table(
    doc: tuple[Any, ...],
) -> tuple[TopicTrie[SessionKey, RouteGrant], Callable[[], SessionFilters]]:
    (
        _,
        levels,
        child_counts,
        sub_counts,
        grant_rows,
        member_sessions,
        member_grants,
        clients,
        incarnations,
        filters,
        s_counts,
        s_filters,
    ) = doc
    grants = [
        RouteGrant(q, nl, rap, rh, sid, (sid,) if sid else ()) for q, nl, rap, rh, sid in grant_rows
    ]
    # Column lengths are checked (strict): a damaged snapshot fails here, not at a publish.
    keys: list[SessionKey] = list(zip(clients, _list(incarnations), strict=True))
    picks = _list(member_sessions)
    counts = _list(sub_counts)
    if sum(counts) != len(picks):
        raise ValueError("subscriber counts do not add up")
    pairs = zip(
        map(keys.__getitem__, picks), map(grants.__getitem__, _list(member_grants)), strict=True
    )
    trie: TopicTrie[SessionKey, RouteGrant] = TopicTrie.from_columns(
        levels, _list(child_counts), counts, pairs
    )
    # Checked now, so that making the session filters later cannot fail.
    per_session, chosen = _array(s_counts), _array(s_filters)
    if len(per_session) != len(keys) or sum(per_session) != len(chosen):
        raise ValueError("session columns do not add up")
    if chosen and not 0 <= min(chosen) <= max(chosen) < len(filters):
        raise ValueError("a session's filter is not in the snapshot")

    def sessions() -> SessionFilters:
        picked = map(filters.__getitem__, chosen)
        sets = map(set, map(islice, repeat(picked), per_session))
        return dict(zip(keys, sets, strict=True))

    return trie, sessions


def load_tenant(table: RouteTable, tenant: str, parts: list[bytes]) -> None:
    trie, sessions = decode_tenant(tenant, parts)
    table.adopt(tenant, trie, sessions)
