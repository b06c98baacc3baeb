"""The safety-net poll of a persistent session's queue (`QueuePoll`): when a session whose
notices may have been lost reads its queue anyway.

A read per connected session per second cost the queue service a quarter of a core for
5,000 idle sessions, so the interval doubles after each poll with nothing heard (no notice,
no entry, no failed read) up to POLL_MAX_S; anything heard brings the next poll within
POLL_MIN_S and the interval back to it. When the queue client's `generation` moves (a queue
link opened or broke, a partition changed owner, NATS reconnected: the times notices get
lost) it polls at once. A notice lost otherwise (e.g. dropped by a slow subscription) waits
at most POLL_MAX_S. Jitter keeps sessions that connected together from polling together.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# Every POLL_MIN_S while anything happens, doubling to POLL_MAX_S while nothing does.
POLL_MIN_S = 1.0
POLL_MAX_S = 16.0


class QueuePoll:
    def __init__(self, generation: int, wake: Callable[[float], None]) -> None:
        """`generation`: the queue client's when the session started; `wake(at)`: the
        sweeper looks at the session at the first tick after `at`."""
        self._wake = wake
        self._every = POLL_MIN_S
        self._at = 0.0
        self._polled_at = 0.0
        self._generation = generation
        self._heard = True  # something happened since the last poll: poll again soon

    def started(self, now: float) -> None:
        """The session's first read (also its first poll) begins now: the next poll is a
        second later (a reconnect storm of N sessions read each queue twice at once
        otherwise)."""
        self._polled_at = now
        self._at = now + POLL_MIN_S
        self._wake(self._at)

    @property
    def next_at(self) -> float:
        """When `due` next says yes, unless the queue client's generation moves first."""
        if self._heard:
            return min(self._at, self._polled_at + POLL_MIN_S)
        return self._at

    def hear(self) -> None:
        """Something happened (a notice, entries, a failed read): poll again soon."""
        if not self._heard:
            self._heard = True
            if self._polled_at + POLL_MIN_S < self._at:
                self._wake(self._polled_at + POLL_MIN_S)

    def due(self, now: float, generation: int) -> bool:
        """Whether to poll now (called by the sweeper at `next_at`, and when the queue
        client's `generation` moved); if so, the next poll is scheduled."""
        moved = generation != self._generation
        if not moved and now < self.next_at:
            return False
        if moved or self._heard:
            self._every = POLL_MIN_S
        else:
            self._every = min(self._every * 2, POLL_MAX_S)
        self._generation = generation
        self._heard = False
        self._polled_at = now
        self._at = now + self._every * random.uniform(0.8, 1.2)
        return True
