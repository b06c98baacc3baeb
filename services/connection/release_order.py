"""The PUBRELs of a persistent session's QoS 2 deliveries (`ReleaseOrder`): each goes out only
once the queue holds its entry as released, durably, and they go out in the order their
PUBRECs came [MQTT-4.6.0-3], whatever order their marks become durable in. A subscriber hands
a QoS 2 message to its application on PUBREL, so a PUBREL that overtook an earlier one would
deliver the messages out of order. One task writes the marks; a mark that failed holds back
the PUBRELs behind it until its retry."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable

from services.common.tasks import TaskSet
from services.connection.channel import Channel
from services.queue.client import QueueClient

log = logging.getLogger("starling.connection.persistence")
# Retry of a released mark the queue could not write: the PUBREL waits for it.
RELEASE_RETRY_S = 0.2


class ReleaseOrder:
    def __init__(
        self,
        *,
        queue: QueueClient,
        tenant: str,
        queue_id: str,
        channel: Channel,
        wrote: Callable[[], None],
        tasks: TaskSet,
    ) -> None:
        """`wrote`: the channel has bytes to send."""
        self._queue = queue
        self._tenant = tenant
        self._queue_id = queue_id
        self._channel = channel
        self._wrote = wrote
        self._tasks = tasks
        # (packet id, seq) whose PUBREC came and whose PUBREL has not gone out, in PUBREC order.
        self._to_release: deque[tuple[int, int]] = deque()
        self._releasing = False  # the task that marks them and sends their PUBRELs runs
        self._stopped = False

    def add(self, marks: Iterable[tuple[int, int]]) -> None:
        """(packet id, seq) of entries the client PUBREC'd, in PUBREC order."""
        self._to_release.extend(marks)
        if self._to_release and not self._releasing:
            self._releasing = True
            self._tasks.spawn(self._release(), name="queue-mark-released")

    def stop(self) -> None:
        """The connection ended: no more marks, no more PUBRELs."""
        self._stopped = True

    async def _release(self) -> None:
        """Mark the entries of `_to_release` released in the queue (those that came while the
        previous call was under way in the next one), then send their PUBRELs in PUBREC order.
        A failed call is retried while the connection lasts, and the PUBRELs wait; if the
        connection ends first, the next one resends the PUBLISH (DUP), which the client, still
        holding the id from its PUBREC, answers without delivering twice."""
        try:
            while self._to_release and not self._stopped:
                batch = len(self._to_release)
                seqs = [seq for _, seq in itertools.islice(self._to_release, batch)]
                try:
                    await self._queue.mark_released(self._tenant, self._queue_id, seqs)
                except Exception as exc:
                    log.warning(
                        "queue_mark_released_failed",
                        extra={"entries": batch, "error": type(exc).__name__},
                    )
                    await asyncio.sleep(RELEASE_RETRY_S)
                    continue
                if self._stopped:
                    return
                ob = self._channel.outbound
                for _ in range(batch):
                    ob.send_pubrel(self._to_release.popleft()[0])
                if self._channel.out:
                    self._wrote()
        finally:
            self._releasing = False
