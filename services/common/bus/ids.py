"""Message ids for what a process publishes into the mesh (connection nodes, the rules
service's republish, the `$SYS` publisher)."""

from __future__ import annotations

import itertools


class MessageIds:
    """Message ids unique across nodes and restarts: node id, the start time of this node
    process in nanoseconds, a counter. The queue's de-duplication keys on them, so a restarted
    node must never hand out an id it used before."""

    __slots__ = ("_counter", "prefix")

    def __init__(self, node_id: str, started_ns: int) -> None:
        self.prefix = f"{node_id}-{started_ns:x}-"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return self.prefix + str(next(self._counter))
