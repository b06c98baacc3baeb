"""The contract of the per-rule dead-letter store: a letter, the bounds of one rule's letters
(`DeadLetterLimits`) and the rule for which letters go past them (`oldest_to_drop`), and
`DeadLetterStore`, the operations every backend keeps (tests/rules/actions/test_dead_letters.py
runs them against each). Backends: services/rules/actions/sqlite_dead_letters.py and
cassandra_dead_letters.py; replay: dead_letter_replay.py."""

from __future__ import annotations

import builtins
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.rules.actions.base import Output
from services.rules.actions.dead_letter_codec import EncodedBatch, encode_batch
from services.rules.actions.dead_letter_replay import ReplayResult, SendFn, replay_letters

log = logging.getLogger("starling.rules.dead_letters")


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    """Bounds of one rule's dead letters; the oldest go first past either."""

    max_count: int = 10_000
    max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    tenant: str
    rule_id: str
    action: str  # the name of the rule's action that failed
    output: Output
    error: str  # the last attempt's error
    attempts: int
    failed_at_ms: int
    size: int  # bytes this letter counts against `max_bytes`


@dataclass(frozen=True, slots=True)
class DeadLetterStats:
    count: int
    bytes: int


def oldest_to_drop(
    rows: Iterable[tuple[int, int]], count: int, total: int, limits: DeadLetterLimits
) -> tuple[builtins.list[int], int]:
    """The ids of the oldest letters to drop so that a rule holding `count` letters of `total`
    bytes is back within `limits`, and the bytes they free. `rows` are the rule's letters as
    (id, size), oldest first; read only as far as needed."""
    gone: builtins.list[int] = []
    freed = 0
    for rid, size in rows:
        if count - len(gone) <= limits.max_count and total - freed <= limits.max_bytes:
            break
        gone.append(rid)
        freed += size
    return gone, freed


class DeadLetterStore(ABC):
    """The contract both backends keep (tests/rules/actions/test_dead_letters.py)."""

    def __init__(self, limits: DeadLetterLimits) -> None:
        self.limits = limits

    async def add(
        self,
        tenant: str,
        rule_id: str,
        action: str,
        outputs: Sequence[Output],
        error: str,
        attempts: int,
    ) -> int:
        """Keep `outputs` durably (returns once written); the number of letters dropped to
        stay within the limits (older ones, or a single letter larger than `max_bytes`)."""
        batch = encode_batch(
            tenant=tenant,
            rule_id=rule_id,
            action=action,
            outputs=outputs,
            error=error,
            attempts=attempts,
            limits=self.limits,
        )
        dropped = await self._write_batch(batch) + batch.dropped
        if dropped:
            log.warning(
                "dead_letters_dropped",
                extra={"tenant": tenant, "rule_id": rule_id, "dropped": dropped},
            )
        return dropped

    @abstractmethod
    async def _write_batch(self, batch: EncodedBatch) -> int:
        """Write `batch` durably, then drop the rule's oldest letters past the limits; how
        many were dropped."""

    @abstractmethod
    async def list(
        self, tenant: str, rule_id: str, *, after_id: int = 0, limit: int = 100
    ) -> builtins.list[DeadLetter]:
        """Oldest first, ids greater than `after_id` (pages: pass the last id seen)."""

    @abstractmethod
    async def get(
        self, tenant: str, rule_id: str, ids: Iterable[int]
    ) -> builtins.list[DeadLetter]: ...

    @abstractmethod
    async def delete(self, tenant: str, rule_id: str, ids: Iterable[int]) -> int: ...

    @abstractmethod
    async def purge(self, tenant: str, rule_id: str) -> int:
        """Drop every letter of the rule (also when the rule is deleted); how many."""

    @abstractmethod
    async def stats(self, tenant: str, rule_id: str) -> DeadLetterStats: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def replay(
        self, tenant: str, rule_id: str, ids: Sequence[int], send: SendFn
    ) -> ReplayResult:
        """Hand the letters `ids` (all of the rule's when empty) back to their actions through
        `send(action, outputs)`, oldest first and grouped per action; a letter is removed only
        once `send` returned for it. A failed group stays stored and that action is not tried
        again in this replay (its target is still down)."""
        return await replay_letters(self, tenant, rule_id, ids, send)
