"""Delivery of one rule action's outputs: batching, bounded retries with back-off (tenacity),
back-pressure, and the hand-over of what still fails to the dead-letter store.

`await Delivery.deliver(outputs)` returns once the outputs were accepted by the target or,
after the retries, written to the dead-letter store: either way the rules service may then
acknowledge the source message. It raises only when neither happened (the dead-letter store
failed, or the delivery closed), and the source message must then stay unacknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from services.rules.actions.base import Action, Output, PermanentActionError
from services.rules.actions.dead_letters import DeadLetterStore, ReplayResult

log = logging.getLogger("starling.rules.delivery")


class DeliveryClosedError(Exception):
    """The delivery closed before these outputs were sent or dead-lettered."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    max_retry_s: float = 60.0  # since the first try
    attempt_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Batching:
    """How outputs are grouped into `Action.send` calls. `linger_s` 0 sends what is queued at
    once (no added latency, batches form only under load); more waits that long for a batch to
    fill to `max_outputs` (HTTP's `batch_ms`)."""

    max_outputs: int = 100
    linger_s: float = 0.0
    in_flight: int = 1  # batches sent at once


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    delivered: bool  # False: dead-lettered
    attempts: int
    error: str = ""


@dataclass(slots=True)
class DeliveryStats:
    sent: int = 0  # outputs accepted by the target
    dead_lettered: int = 0
    dropped: int = 0  # dead letters dropped to keep the store within its bounds
    retries: int = 0  # tries after a failed one


class _Entry:
    __slots__ = ("done", "outputs")

    def __init__(self, outputs: list[Output], done: asyncio.Future[DeliveryOutcome]) -> None:
        self.outputs = outputs
        self.done = done


def _retryable(exc: BaseException) -> bool:
    return not isinstance(exc, PermanentActionError)


class Delivery:
    """The outputs of one action of one rule, delivered in batches by `batching.in_flight`
    workers. At most `max_pending` outputs are held (queued or being sent): `deliver` waits
    for room, so a slow target slows the consumption of the rule's stream instead of growing
    memory."""

    def __init__(
        self,
        action: Action,
        tenant: str,
        rule_id: str,
        dead_letters: DeadLetterStore,
        retry: RetryPolicy | None = None,
        *,
        action_name: str = "0",
        batching: Batching | None = None,
        max_pending: int = 1000,
    ) -> None:
        self.action = action
        self.tenant = tenant
        self.rule_id = rule_id
        self.action_name = action_name
        self.dead_letters = dead_letters
        self.retry = retry or RetryPolicy()
        # An action may carry its own batching (HTTP's batch_size/batch_ms params).
        self.batching = batching or getattr(action, "batching", None) or Batching()
        self.max_pending = max_pending
        self.stats = DeliveryStats()
        self._queue: deque[_Entry] = deque()
        self._held = 0  # outputs queued or in flight
        self._room = asyncio.Condition()
        self._work = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False

    async def start(self) -> None:
        await self.action.start()
        self._workers = [
            asyncio.create_task(self._worker(), name=f"delivery-{self.rule_id}-{i}")
            for i in range(self.batching.in_flight)
        ]

    @property
    def held(self) -> int:
        """Outputs accepted by `deliver` and not yet sent or dead-lettered."""
        return self._held

    async def deliver(self, outputs: Sequence[Output]) -> DeliveryOutcome:
        if not outputs:
            return DeliveryOutcome(True, 0)
        if self._closed:
            raise DeliveryClosedError(f"rule {self.rule_id} action {self.action_name} closed")
        n = len(outputs)
        async with self._room:
            # A call larger than the whole bound still goes through when nothing else is held.
            await self._room.wait_for(
                lambda: self._closed or self._held == 0 or self._held + n <= self.max_pending
            )
            if self._closed:
                raise DeliveryClosedError(f"rule {self.rule_id} action {self.action_name} closed")
            self._held += n
        done: asyncio.Future[DeliveryOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append(_Entry(list(outputs), done))
        self._work.set()
        return await asyncio.shield(done)

    async def send_with_retries(self, outputs: Sequence[Output]) -> int:
        """Send `outputs` through the action with the retry policy; the number of tries.
        Raises the last error once the policy gives up (or at once for a permanent one)."""
        attempts, error = await self._send_retrying(outputs)
        if error is not None:
            raise error
        return attempts

    async def _send_retrying(self, outputs: Sequence[Output]) -> tuple[int, Exception | None]:
        attempts = 0

        def count(state: RetryCallState) -> None:
            self.stats.retries += 1

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retry.max_attempts)
            | stop_after_delay(self.retry.max_retry_s),
            # Doubling waits with jitter so many rules retrying one target spread out.
            wait=wait_exponential(
                multiplier=self.retry.initial_backoff_s, max=self.retry.max_backoff_s
            )
            + wait_random(0, self.retry.initial_backoff_s),
            retry=retry_if_exception(_retryable),
            before_sleep=count,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    async with asyncio.timeout(self.retry.attempt_timeout_s):
                        await self._send_chunks(outputs)
        except Exception as exc:
            return attempts, exc
        return attempts, None

    async def _send_chunks(self, outputs: Sequence[Output]) -> None:
        size = self.batching.max_outputs
        for i in range(0, len(outputs), size):
            await self.action.send(outputs[i : i + size])

    async def _take(self) -> list[_Entry]:
        """The next batch: entries up to `max_outputs` outputs (at least one entry)."""
        while not self._queue:
            self._work.clear()
            await self._work.wait()
        if self.batching.linger_s > 0:
            deadline = time.monotonic() + self.batching.linger_s
            while sum(len(e.outputs) for e in self._queue) < self.batching.max_outputs:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._work.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._work.wait()
        batch = [self._queue.popleft()]
        count = len(batch[0].outputs)
        while self._queue and count + len(self._queue[0].outputs) <= self.batching.max_outputs:
            entry = self._queue.popleft()
            batch.append(entry)
            count += len(entry.outputs)
        return batch

    async def _worker(self) -> None:
        while True:
            batch = await self._take()
            try:
                outcome = await self._deliver_batch([o for e in batch for o in e.outputs])
            except BaseException as exc:
                for e in batch:
                    if not e.done.done():
                        e.done.set_exception(
                            DeliveryClosedError("delivery closed")
                            if isinstance(exc, asyncio.CancelledError)
                            else exc
                        )
                await self._release(batch)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for e in batch:
                if not e.done.done():
                    e.done.set_result(outcome)
            await self._release(batch)

    async def _release(self, batch: list[_Entry]) -> None:
        async with self._room:
            self._held -= sum(len(e.outputs) for e in batch)
            self._room.notify_all()

    async def _deliver_batch(self, outputs: list[Output]) -> DeliveryOutcome:
        attempts, exc = await self._send_retrying(outputs)
        if exc is None:
            self.stats.sent += len(outputs)
            return DeliveryOutcome(True, attempts)
        error = f"{type(exc).__name__}: {exc}"
        log.warning(
            "action_failed",
            extra={
                "tenant": self.tenant,
                "rule_id": self.rule_id,
                "action": self.action_name,
                "outputs": len(outputs),
                "attempts": attempts,
                "error": error[:300],
            },
        )
        # Written before the outputs count as handled: the caller acks after this returns.
        self.stats.dropped += await self.dead_letters.add(
            self.tenant, self.rule_id, self.action_name, outputs, error, attempts
        )
        self.stats.dead_lettered += len(outputs)
        return DeliveryOutcome(False, attempts, error)

    async def close(self, drain_s: float = 5.0) -> None:
        """Stop taking outputs, give those held up to `drain_s` to finish, then fail the rest
        with `DeliveryClosedError` (their source messages stay unacknowledged) and close the
        action."""
        self._closed = True
        async with self._room:
            self._room.notify_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(drain_s):
                    await self._room.wait_for(lambda: self._held == 0)
        for w in self._workers:
            w.cancel()
        for w in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
        while self._queue:
            e = self._queue.popleft()
            if not e.done.done():
                e.done.set_exception(DeliveryClosedError("delivery closed"))
        await self.action.close()


async def replay(
    dead_letters: DeadLetterStore,
    tenant: str,
    rule_id: str,
    ids: Sequence[int],
    deliveries: Mapping[str, Delivery],
) -> ReplayResult:
    """Re-deliver a rule's dead letters (`ids`, or all when empty) through the rule's current
    actions, by action name, each with its retry policy; a letter leaves the store only once
    its action accepted it. Letters of an action the rule no longer has stay and count as
    failed."""

    async def send(action: str, outputs: Sequence[Output]) -> None:
        delivery = deliveries.get(action)
        if delivery is None:
            raise LookupError(f"the rule has no action {action!r} any more")
        await delivery.send_with_retries(outputs)
        delivery.stats.sent += len(outputs)

    return await dead_letters.replay(tenant, rule_id, ids, send)
