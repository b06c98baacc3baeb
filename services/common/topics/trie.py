"""Subscription trie: topic filters to subscribers, matched per topic name.

Theory of operation: each node holds its children by level string (`+` and `#` are ordinary
keys) and the subscribers whose filter ends there. Matching walks the topic levels with a
frontier of nodes; a `#` child contributes at every step (it also matches its parent level,
[MQTT-4.7.1-2]); wildcards at the first level never match a topic that starts with `$`
[MQTT-4.7.2-1]. Cost is proportional to what matches, not to how many filters are stored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from itertools import compress, islice, repeat
from operator import not_
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


# The children or subscribers of a node that has none: one shared dict, never written (a
# node gets a dict of its own with its first child or subscriber). Most nodes are leaves or
# have no subscribers of their own, so a large trie is a third fewer objects to make (a
# snapshot load) and to keep.
_NONE: dict[Any, Any] = {}


class _Node(Generic[K, V]):
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] = _NONE
        self.subs: dict[K, V] = _NONE


class TopicTrie(Generic[K, V]):
    """Map (filter, subscriber key) to a value; `match(topic)` yields every hit."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def count_under(self, level: str) -> int:
        """Subscribers of the filters whose first level is `level` (`$share`: the shared
        subscriptions), by a walk of that branch only."""
        node = self._root.children.get(level)
        if node is None:
            return 0
        count, stack = 0, [node]
        while stack:
            node = stack.pop()
            count += len(node.subs)
            stack.extend(node.children.values())
        return count

    def add(self, filt: str, key: K, value: V) -> bool:
        """Insert or replace; True when (filt, key) is new."""
        node = self._root
        for level in filt.split("/"):
            children = node.children
            child = children.get(level)
            if child is None:
                if children is _NONE:
                    children = node.children = {}
                child = children[level] = _Node()
            node = child
        subs = node.subs
        if subs is _NONE:
            subs = node.subs = {}
        new = key not in subs
        subs[key] = value
        if new:
            self._count += 1
        return new

    def remove(self, filt: str, key: K) -> bool:
        """Delete (filt, key); prune empty nodes. True when something was removed."""
        path: list[tuple[_Node[K, V], str]] = []
        node = self._root
        for level in filt.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.subs.pop(key, _MISSING) is _MISSING:  # (never a write to _NONE)
            return False
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.subs or child.children:
                break
            del parent.children[level]
        return True

    def get(self, filt: str, key: K) -> V | None:
        node = self._root
        for level in filt.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.subs.get(key)

    def match(self, topic: str) -> list[tuple[K, V]]:
        """Every (key, value) whose filter matches `topic`; one entry per matching filter."""
        out: list[tuple[K, V]] = []
        nodes = [self._root]
        dollar = topic[:1] == "$"
        for level in topic.split("/"):
            nxt: list[_Node[K, V]] = []
            for node in nodes:
                children = node.children
                if not children:
                    continue
                if not dollar:
                    hash_node = children.get("#")
                    if hash_node is not None:
                        out.extend(hash_node.subs.items())
                    plus = children.get("+")
                    if plus is not None:
                        nxt.append(plus)
                exact = children.get(level)
                if exact is not None:
                    nxt.append(exact)
            if not nxt:
                return out
            nodes = nxt
            dollar = False
        for node in nodes:
            if node.subs:
                out.extend(node.subs.items())
            hash_node = node.children.get("#")
            if hash_node is not None:
                out.extend(hash_node.subs.items())
        return out

    def items(self) -> Iterator[tuple[str, K, V]]:
        """Every (filter, key, value), depth first."""
        stack: list[tuple[str, _Node[K, V]]] = [("", self._root)]
        while stack:
            prefix, node = stack.pop()
            for k, v in node.subs.items():
                yield prefix, k, v
            for level, child in node.children.items():
                stack.append(
                    (f"{prefix}/{level}" if prefix or node is not self._root else level, child)
                )

    def columns(self) -> tuple[list[str], list[int], list[int], list[tuple[K, V]]]:
        """The trie as flat columns, for a snapshot that `from_columns` loads without running
        Python code per node: the nodes in breadth-first order (the root first), so each
        node's children are one run of consecutive nodes; every node but the root as its
        level; per node its number of children and of subscribers; and the subscribers of
        every node, node after node."""
        levels: list[str] = []
        child_counts: list[int] = []
        sub_counts: list[int] = []
        members: list[tuple[K, V]] = []
        queue = [self._root]
        for node in queue:  # grows while it is walked: breadth first
            child_counts.append(len(node.children))
            levels += node.children
            queue += node.children.values()
            sub_counts.append(len(node.subs))
            members += node.subs.items()
        return levels, child_counts, sub_counts, members

    @classmethod
    def from_columns(
        cls,
        levels: list[str],
        child_counts: list[int],
        sub_counts: list[int],
        members: Iterable[tuple[K, V]],
    ) -> TopicTrie[K, V]:
        """The trie `columns()` described. Every node and dict is made by `map` in C (no
        bytecode runs per node or subscriber): a million subscriptions load in about a
        second where adding them one by one takes several."""
        if len(child_counts) != len(sub_counts) or len(levels) + 1 != len(child_counts):
            raise ValueError("trie columns of different lengths")
        if sum(child_counts) != len(levels):
            raise ValueError("trie columns: children do not add up to the nodes")
        count = len(child_counts)
        new = _Node.__new__  # no __init__: both slots are set just below
        nodes: list[_Node[K, V]] = list(map(new, repeat(_Node, count)))
        # Node i's children are the next child_counts[i] (level, node) pairs after the root,
        # its subscribers the next sub_counts[i] members; the other nodes share _NONE.
        below = zip(levels, islice(nodes, 1, None), strict=True)
        runs = map(dict, map(islice, repeat(below), filter(None, child_counts)))
        deque(map(setattr, compress(nodes, child_counts), repeat("children"), runs), 0)
        deque(
            map(
                setattr, compress(nodes, map(not_, child_counts)), repeat("children"), repeat(_NONE)
            ),
            0,
        )
        deque(
            map(setattr, compress(nodes, map(not_, sub_counts)), repeat("subs"), repeat(_NONE)), 0
        )
        pairs = iter(members)
        subs = list(map(dict, map(islice, repeat(pairs), filter(None, sub_counts))))
        if next(pairs, _MISSING) is not _MISSING:
            raise ValueError("trie columns: more subscribers than the counts say")
        deque(map(setattr, compress(nodes, sub_counts), repeat("subs"), subs), 0)
        trie: TopicTrie[K, V] = cls()
        trie._root = nodes[0]
        trie._count = sum(map(len, subs))
        return trie


_MISSING = object()
