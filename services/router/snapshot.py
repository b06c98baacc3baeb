"""The routing snapshot's format: one tenant's persistent route table as compact columns
that load in bulk, with no pickle (nothing in it can run code) and no per-subscription
parsing.

A tenant's snapshot is marshal data (flat lists of strings and packed integer arrays),
zlib-compressed and cut into parts of at most PART_BYTES (Cassandra cells stay small). It
holds the table's trie shape (each node's level and parent, services/common/topics/trie.py),
the subscribers of each node as (client id, incarnation, grant) columns with the distinct
grants listed once, and each session's filters as indices. Loading rebuilds the trie node by
node (never splitting a filter) and makes the subscriber maps in C (`zip`, `map`), which is
what makes a boot from a snapshot several times faster than adding every subscription.
"""

from __future__ import annotations

import marshal
import zlib
from array import array
from itertools import islice, repeat

from services.common.topics.trie import TopicTrie
from services.router.core import RouteGrant, RouteTable, SessionFilters, SessionKey

FORMAT = 1
PART_BYTES = 1 << 20
_LEVEL = 1  # zlib: most of the size win for a fraction of the time of the higher levels


class SnapshotFormatError(ValueError):
    """A part is not a snapshot this code reads."""


def _ints(values: list[int]) -> bytes:
    return array("q", values).tobytes()


def _list(data: bytes) -> list[int]:
    a = array("q")
    a.frombytes(data)
    return a.tolist()


def encode_tenant(table: RouteTable, tenant: str) -> tuple[int, list[bytes]]:
    """The tenant's subscription count and its snapshot parts."""
    trie = table.trie(tenant)
    if trie is None:
        return 0, []
    levels, parents, subs = trie.shape()
    paths = [""]
    for level, parent in zip(levels, parents, strict=True):
        up = paths[parent]
        paths.append(f"{up}/{level}" if parent else level)
    grants: dict[RouteGrant, int] = {}
    node_index: list[int] = []
    node_count: list[int] = []
    clients: list[str] = []
    incarnations: list[int] = []
    grant_index: list[int] = []
    filter_index: dict[str, int] = {}
    for index, members in subs:
        filter_index[paths[index]] = len(node_index)
        node_index.append(index)
        node_count.append(len(members))
        for (client_id, incarnation), g in members.items():
            clients.append(client_id)
            incarnations.append(incarnation)
            grant_index.append(grants.setdefault(g, len(grants)))
    s_clients: list[str] = []
    s_incs: list[int] = []
    s_counts: list[int] = []
    s_filters: list[int] = []
    for (t, client_id, incarnation), filters in table.session_filters(tenant):
        s_clients.append(client_id)
        s_incs.append(incarnation)
        s_counts.append(len(filters))
        s_filters += [filter_index[f] for f in filters]
        del t
    doc = (
        FORMAT,
        levels,
        _ints(parents),
        [tuple(g[:5]) for g in grants],
        _ints(node_index),
        _ints(node_count),
        clients,
        _ints(incarnations),
        _ints(grant_index),
        [paths[i] for i in node_index],
        s_clients,
        _ints(s_incs),
        _ints(s_counts),
        _ints(s_filters),
    )
    blob = zlib.compress(marshal.dumps(doc), _LEVEL)
    parts = [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [b""]
    return len(clients), parts


def decode_tenant(
    tenant: str, parts: list[bytes]
) -> tuple[TopicTrie[SessionKey, RouteGrant], SessionFilters]:
    """The trie and session filters `encode_tenant` wrote (for `RouteTable.adopt`)."""
    try:
        doc = marshal.loads(zlib.decompress(b"".join(parts)))
        fmt = doc[0]
    except (ValueError, EOFError, TypeError, IndexError, zlib.error) as exc:
        raise SnapshotFormatError(f"snapshot of {tenant!r} does not decode: {exc}") from exc
    if fmt != FORMAT:
        raise SnapshotFormatError(f"snapshot of {tenant!r} has format {fmt}, not {FORMAT}")
    (
        _,
        levels,
        parents,
        grant_rows,
        node_index,
        node_count,
        clients,
        incarnations,
        grant_index,
        filters,
        s_clients,
        s_incs,
        s_counts,
        s_filters,
    ) = doc
    grants = [
        RouteGrant(q, nl, rap, rh, sid, (sid,) if sid else ()) for q, nl, rap, rh, sid in grant_rows
    ]
    # Column lengths are checked (strict): a damaged snapshot fails here, not at a publish.
    keys = zip(clients, _list(incarnations), strict=True)
    pairs = zip(keys, map(grants.__getitem__, _list(grant_index)), strict=True)
    # One dict per node made by map() in C: no bytecode runs per node or subscriber.
    counts = _list(node_count)
    members = map(dict, map(islice, repeat(pairs), counts))
    subs = zip(_list(node_index), members, strict=True)
    trie: TopicTrie[SessionKey, RouteGrant] = TopicTrie.from_shape(levels, _list(parents), subs)
    picks = map(filters.__getitem__, _list(s_filters))
    s_keys = zip(repeat(tenant), s_clients, _list(s_incs), strict=False)
    s_sets = map(set, map(islice, repeat(picks), _list(s_counts)))
    sessions: SessionFilters = dict(zip(s_keys, s_sets, strict=True))
    return trie, sessions


def load_tenant(table: RouteTable, tenant: str, parts: list[bytes]) -> None:
    trie, sessions = decode_tenant(tenant, parts)
    table.adopt(tenant, trie, sessions)
