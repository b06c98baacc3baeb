"""The acks of a persistent session's queue from the connection that delivers it
(`QueueAcks`): batched (at once when ACK_EVERY entries are due, else after ACK_DELAY_S), one
under way at a time, each renewing the reader's push credit, and the final one that detaches
the reader. The delivery (persistence.py) says through which seq every delivered entry is
complete (`through`) and what credit to renew (`room`); this owns what the queue was acked
through and the timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.common.tasks import TaskSet
from services.queue.client import QueueClient

log = logging.getLogger("starling.connection.persistence")

ACK_EVERY = 64
ACK_DELAY_S = 0.02

# (reader, entries its window takes now, highest seq received): the ack's credit renewal.
Room = tuple[str, int, int]


class QueueAcks:
    def __init__(
        self,
        *,
        queue: QueueClient,
        tenant: str,
        queue_id: str,
        tasks: TaskSet,
        through: Callable[[], int],
        room: Callable[[], Room | None],
    ) -> None:
        """`through()`: the highest seq below which every delivered entry is complete;
        `room()`: the push credit to renew with an ack (None: none now)."""
        self._queue = queue
        self._tenant = tenant
        self._queue_id = queue_id
        self._tasks = tasks
        self._through = through
        self._room = room
        self.acked = 0  # what the queue was acked through (or held as acked at the first read)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start_at(self, acked_through: int) -> None:
        """The first read's answer: the queue holds everything through `acked_through` as
        acked already."""
        self.acked = acked_through

    def schedule(self) -> None:
        """Entries may have completed: ack them, soon or at once if many are due."""
        if self._stopped or self._task is not None:
            return
        through = self._through()
        if through <= self.acked:
            return
        delay = 0.0 if through - self.acked >= ACK_EVERY else ACK_DELAY_S
        self._task = self._tasks.spawn(self._later(delay), name="queue-ack")

    async def _later(self, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            through = self._through()
            if through > self.acked:
                await self._queue.ack(self._tenant, self._queue_id, through, renew=self._room())
                self.acked = through
        except Exception as exc:  # retried with the next progress
            log.warning("queue_ack_failed", extra={"error": type(exc).__name__})
        finally:
            self._task = None

    def stop(self) -> None:
        """The connection ended: no more batched acks (`final` sends the last one)."""
        self._stopped = True

    async def final(self, reader: str) -> None:
        """Flush the last ack; it also tells the queue to push nothing more to `reader`."""
        through = self._through()
        try:
            await self._queue.ack(
                self._tenant,
                self._queue_id,
                through if through > self.acked else 0,
                detach_reader=reader,
            )
        except Exception as exc:
            log.warning("queue_final_ack_failed", extra={"error": type(exc).__name__})
