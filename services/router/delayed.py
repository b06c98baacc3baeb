"""Delayed publish: `$delayed/{seconds}/{topic}` (parsed by services.common.topics.delayed)
is stored and published when due.

The schedule is a heap in memory over records in the store; it is rebuilt from the store at
start, so delayed messages survive a restart of every service. A message is published and
only then deleted, so a crash in between publishes it again (persistent queues drop the
repeat by message id).
"""

from __future__ import annotations

import heapq


class Schedule:
    """Due times of delayed messages: (due_ms, tenant, id)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, str, str]] = []
        self._cancelled: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due_ms: int, tenant: str, id: str) -> None:
        self._cancelled.discard((tenant, id))
        heapq.heappush(self._heap, (due_ms, tenant, id))

    def cancel(self, tenant: str, id: str) -> None:
        self._cancelled.add((tenant, id))

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[tuple[str, str]]:
        out = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, tenant, id = heapq.heappop(self._heap)
            if (tenant, id) in self._cancelled:
                self._cancelled.discard((tenant, id))
                continue
            out.append((tenant, id))
        return out
