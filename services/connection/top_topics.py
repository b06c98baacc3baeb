"""A tenant's busiest topics between two stats reports, in bounded memory (pure).

Space-saving (Metwally et al.): at most `capacity` topics are tracked; a topic not tracked
while the table is full replaces the one with the lowest count and inherits that count, so a
topic's count is an over-estimate by at most the count it inherited, and every topic busier
than total/capacity is in the table. The node feeds it a sample, not every message (every
`SAMPLE_EVERY`-th publish of the tenant, weighted by `SAMPLE_EVERY`): no lookup by topic per
QoS 0 message on the hot path.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.message import Message

SAMPLE_EVERY = 8  # one publish in this many is looked at (weighted by it)
CAPACITY = 64  # topics tracked per tenant between two reports (memory bound)
REPORTED = 20  # topics per tenant in each report


class TopTopics:
    __slots__ = ("_counts", "_skip", "capacity")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._counts: dict[str, int] = {}
        self._skip = 0  # publishes to pass before the next sampled one

    def sample(self, msgs: Sequence[Message]) -> None:
        """A batch of the tenant's publishes: every SAMPLE_EVERY-th one is counted."""
        n = len(msgs)
        i = self._skip
        while i < n:
            self.add(msgs[i].topic, SAMPLE_EVERY)
            i += SAMPLE_EVERY
        self._skip = i - n

    def add(self, topic: str, weight: int) -> None:
        counts = self._counts
        c = counts.get(topic)
        if c is not None:
            counts[topic] = c + weight
        elif len(counts) < self.capacity:
            counts[topic] = weight
        else:
            low = min(counts, key=counts.__getitem__)
            counts[topic] = counts.pop(low) + weight

    def take(self, k: int = REPORTED) -> list[tuple[str, int]]:
        """The `k` busiest topics with their (estimated) counts, busiest first; the table
        starts again from empty."""
        top = sorted(self._counts.items(), key=lambda tc: (-tc[1], tc[0]))[:k]
        self._counts = {}
        return top
