"""Subscription trie: topic filters to subscribers, matched per topic name.

Theory of operation: each node holds its children by level string (`+` and `#` are ordinary
keys) and the subscribers whose filter ends there. Matching walks the topic levels with a
frontier of nodes; a `#` child contributes at every step (it also matches its parent level,
[MQTT-4.7.1-2]); wildcards at the first level never match a topic that starts with `$`
[MQTT-4.7.2-1]. Cost is proportional to what matches, not to how many filters are stored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Node(Generic[K, V]):
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] = {}
        self.subs: dict[K, V] = {}


class TopicTrie(Generic[K, V]):
    """Map (filter, subscriber key) to a value; `match(topic)` yields every hit."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, filt: str, key: K, value: V) -> bool:
        """Insert or replace; True when (filt, key) is new."""
        node = self._root
        for level in filt.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        new = key not in node.subs
        node.subs[key] = value
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
        if node.subs.pop(key, _MISSING) is _MISSING:
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

    def shape(self) -> tuple[list[str], list[int], list[tuple[int, dict[K, V]]]]:
        """The trie as flat columns, for a snapshot that loads without splitting a filter:
        every node but the root in pre-order as its level and its parent's index (the root is
        0, the first node 1), and (node index, subscribers) of the nodes that have some."""
        levels: list[str] = []
        parents: list[int] = []
        subs: list[tuple[int, dict[K, V]]] = []
        stack: list[tuple[int, _Node[K, V]]] = [(0, self._root)]
        if self._root.subs:
            subs.append((0, self._root.subs))
        while stack:
            index, node = stack.pop()
            for level, child in node.children.items():
                levels.append(level)
                parents.append(index)
                mine = len(levels)
                if child.subs:
                    subs.append((mine, child.subs))
                stack.append((mine, child))
        return levels, parents, subs

    @classmethod
    def from_shape(
        cls, levels: list[str], parents: list[int], subs: Iterable[tuple[int, dict[K, V]]]
    ) -> TopicTrie[K, V]:
        """The trie `shape()` described (the subscriber dicts are adopted, not copied)."""
        trie: TopicTrie[K, V] = cls()
        nodes: list[_Node[K, V]] = [trie._root]
        nodes += [_Node() for _ in levels]
        for child, level, parent in zip(nodes[1:], levels, parents, strict=True):
            nodes[parent].children[level] = child
        count = 0
        for index, members in subs:
            nodes[index].subs = members
            count += len(members)
        trie._count = count
        return trie


_MISSING = object()
