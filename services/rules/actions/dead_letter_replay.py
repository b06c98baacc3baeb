"""Replaying a rule's dead letters: letters read a page at a time, oldest first, handed to
their actions grouped per action, and removed only once the action accepted them. Called
through `DeadLetterStore.replay` (services/rules/actions/dead_letter_store.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.rules.actions.base import Output

if TYPE_CHECKING:
    from services.rules.actions.dead_letter_store import DeadLetter, DeadLetterStore

# How many letters one replay hands to an action at a time (one request for batching targets).
REPLAY_CHUNK = 100

SendFn = Callable[[str, Sequence[Output]], Awaitable[None]]


@dataclass(slots=True)
class ReplayResult:
    delivered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # one line per failed group, bounded


async def replay_letters(
    store: DeadLetterStore, tenant: str, rule_id: str, ids: Sequence[int], send: SendFn
) -> ReplayResult:
    """See `DeadLetterStore.replay`: a failed group stays stored and its action is not tried
    again in this replay."""
    result = ReplayResult()
    broken: set[str] = set()
    async for letters in _pages(store, tenant, rule_id, ids):
        by_action: dict[str, list[DeadLetter]] = {}
        for letter in letters:
            by_action.setdefault(letter.action, []).append(letter)
        for action, group in by_action.items():
            if action in broken:
                result.failed += len(group)
                continue
            try:
                await send(action, [g.output for g in group])
            except Exception as exc:
                broken.add(action)
                result.failed += len(group)
                if len(result.errors) < 10:
                    result.errors.append(f"{action}: {exc!r}"[:500])
                continue
            await store.delete(tenant, rule_id, [g.id for g in group])
            result.delivered += len(group)
    return result


async def _pages(
    store: DeadLetterStore, tenant: str, rule_id: str, ids: Sequence[int]
) -> AsyncIterator[list[DeadLetter]]:
    if ids:
        wanted = sorted(set(ids))
        for i in range(0, len(wanted), REPLAY_CHUNK):
            yield await store.get(tenant, rule_id, wanted[i : i + REPLAY_CHUNK])
        return
    # Oldest first behind a moving cursor: a failed group stays behind it, so each letter
    # is tried at most once per replay.
    after = 0
    while True:
        page = await store.list(tenant, rule_id, after_id=after, limit=REPLAY_CHUNK)
        if not page:
            return
        after = page[-1].id
        yield page
