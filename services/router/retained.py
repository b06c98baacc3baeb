"""Retained messages in memory: one trie of topic names per tenant.

Theory of operation: where the subscription trie stores filters and is walked by a topic,
this index stores topics and is walked by a filter. A literal level follows one child, `+`
fans out over the children of one level, `#` takes the whole subtree (and the parent level,
[MQTT-4.7.1-2]); wildcards at the first level skip topics starting with `$` [MQTT-4.7.2-1].
So a SUBSCRIBE costs what it matches, not what is stored; `match` reports how many trie
nodes it examined, which the admin API exposes. Per tenant the index also keeps how many
messages and how many bytes (serialized size) it holds, which the retained caps are checked
against: the tenant's own, not the `$SYS/` ones the metrics service publishes into its space
(services/metrics/sys_publisher.py), which the tenant neither controls nor can delete.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def is_sys(topic: str) -> bool:
    """A `$SYS` topic: published by the server, not counted as the tenant's."""
    return topic[:5] == "$SYS/"


@dataclass(slots=True)
class Retained:
    data: bytes  # serialized RoutedMessage
    expires_at_ms: int  # 0: never


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    value: Retained | None = None


class RetainedIndex:
    def __init__(self) -> None:
        self._roots: dict[str, _Node] = {}
        self._counts: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def count(self, tenant: str) -> int:
        return self._counts.get(tenant, 0)

    def tenants(self) -> list[str]:
        """Tenants with retained messages."""
        return [t for t, n in list(self._counts.items()) if n]

    def size(self, tenant: str) -> int:
        """Bytes of the tenant's retained messages (their serialized size)."""
        return self._bytes.get(tenant, 0)

    def get(self, tenant: str, topic: str) -> Retained | None:
        node = self._find(tenant, topic)
        return None if node is None else node.value

    def has(self, tenant: str, topic: str) -> bool:
        node = self._find(tenant, topic)
        return node is not None and node.value is not None

    def _find(self, tenant: str, topic: str) -> _Node | None:
        node = self._roots.get(tenant)
        for level in topic.split("/"):
            if node is None:
                return None
            node = node.children.get(level)
        return node

    def drop_tenant(self, tenant: str) -> None:
        """Forget every retained message of the tenant (it is about to be reloaded)."""
        self._roots.pop(tenant, None)
        self._counts.pop(tenant, None)
        self._bytes.pop(tenant, None)

    def put(self, tenant: str, topic: str, value: Retained) -> None:
        node = self._roots.setdefault(tenant, _Node())
        for level in topic.split("/"):
            node = node.children.setdefault(level, _Node())
        if is_sys(topic):  # not the tenant's: not counted (module doc)
            node.value = value
            return
        old = 0
        if node.value is None:
            self._counts[tenant] = self._counts.get(tenant, 0) + 1
        else:
            old = len(node.value.data)
        self._bytes[tenant] = self._bytes.get(tenant, 0) - old + len(value.data)
        node.value = value

    def delete(self, tenant: str, topic: str) -> bool:
        root = self._roots.get(tenant)
        if root is None:
            return False
        path = [root]
        for level in topic.split("/"):
            nxt = path[-1].children.get(level)
            if nxt is None:
                return False
            path.append(nxt)
        value = path[-1].value
        if value is None:
            return False
        path[-1].value = None
        if not is_sys(topic):
            self._counts[tenant] -= 1
            self._bytes[tenant] -= len(value.data)
        for parent, level in zip(reversed(path[:-1]), reversed(topic.split("/")), strict=True):
            child = parent.children[level]
            if child.value is not None or child.children:
                break
            del parent.children[level]
        return True

    def expired(self, tenant: str, now_ms: int) -> list[str]:
        """Topics of the tenant's retained messages that have expired (still stored)."""
        root = self._roots.get(tenant)
        out: list[str] = []
        stack: list[tuple[_Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
        while stack:
            node, path = stack.pop()
            v = node.value
            if v is not None and v.expires_at_ms and v.expires_at_ms <= now_ms:
                out.append("/".join(path))
            stack.extend((c, (*path, name)) for name, c in node.children.items())
        return out

    def match(self, tenant: str, filt: str, now_ms: int) -> tuple[list[tuple[str, Retained]], int]:
        """Unexpired (topic, value) pairs matching `filt`, and the number of nodes examined."""
        root = self._roots.get(tenant)
        if root is None:
            return [], 0
        levels = filt.split("/")
        out: list[tuple[str, Retained]] = []
        examined = 0
        stack: list[tuple[_Node, int, tuple[str, ...]]] = [(root, 0, ())]
        while stack:
            node, i, path = stack.pop()
            examined += 1
            if i == len(levels):
                self._emit(node, path, now_ms, out)
                continue
            level = levels[i]
            if level == "#":
                if i:  # `a/#` also matches `a` itself
                    self._emit(node, path, now_ms, out)
                sub = [
                    (c, (*path, name))
                    for name, c in node.children.items()
                    if not (i == 0 and name.startswith("$"))
                ]
                while sub:
                    n, p = sub.pop()
                    examined += 1
                    self._emit(n, p, now_ms, out)
                    sub.extend((c, (*p, name)) for name, c in n.children.items())
            elif level == "+":
                for name, child in node.children.items():
                    if not (i == 0 and name.startswith("$")):
                        stack.append((child, i + 1, (*path, name)))
            else:
                child = node.children.get(level)
                if child is not None:
                    stack.append((child, i + 1, (*path, level)))
        return out, examined

    @staticmethod
    def _emit(
        node: _Node, path: tuple[str, ...], now_ms: int, out: list[tuple[str, Retained]]
    ) -> None:
        v = node.value
        if v is not None and (not v.expires_at_ms or v.expires_at_ms > now_ms):
            out.append(("/".join(path), v))
