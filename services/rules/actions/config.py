"""Settings of rule actions: retries, back-pressure, batching defaults and dead-letter bounds.

`ActionSettings` is a mixin of the rules service's settings model (`class RulesSettings(
ServiceSettings, ActionSettings)`), so these are `STARLING_*` settings like every other and
appear in docs/configuration.md. `retry_policy`, `dead_letter_limits` and `open_dead_letters`
turn them into what `Delivery` and the dead-letter stores take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from services.rules.actions.dead_letters import (
    CassandraDeadLetters,
    DeadLetterLimits,
    DeadLetterStore,
    SqliteDeadLetters,
)
from services.rules.actions.delivery import RetryPolicy


class ActionSettings(BaseModel):
    action_retry_max_attempts: int = Field(
        default=5, ge=1, le=100, description="Tries of one batch before it is dead-lettered."
    )
    action_retry_initial_backoff_s: float = Field(
        default=0.2, gt=0, le=60, description="First wait between tries (doubles, jittered)."
    )
    action_retry_max_backoff_s: float = Field(
        default=10.0, gt=0, le=600, description="Longest wait between two tries."
    )
    action_retry_max_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="A batch still failing this long after its first try is dead-lettered.",
    )
    action_attempt_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="One try of an action that takes longer failed."
    )
    action_max_pending_outputs: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Outputs one action holds (queued and in flight); past it delivery waits "
        "(back-pressure on the rule's stream consumption).",
    )
    action_batch_max_outputs: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Most outputs handed to an action at once (an action's `batch_size` param "
        "overrides it).",
    )
    dead_letter_max_count: int = Field(
        default=10_000, ge=1, description="Dead letters kept per rule; the oldest go first."
    )
    dead_letter_max_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="Bytes of dead letters kept per rule; the oldest go first.",
    )

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.action_retry_max_attempts,
            initial_backoff_s=self.action_retry_initial_backoff_s,
            max_backoff_s=self.action_retry_max_backoff_s,
            max_retry_s=self.action_retry_max_s,
            attempt_timeout_s=self.action_attempt_timeout_s,
        )

    def dead_letter_limits(self) -> DeadLetterLimits:
        return DeadLetterLimits(self.dead_letter_max_count, self.dead_letter_max_bytes)


def open_dead_letters(settings: Any, data_dir: Path | None = None) -> DeadLetterStore:
    """The dead-letter store of the configured backend: Cassandra when the service settings
    name contact points, otherwise `rules_dead_letters.db` under `data_dir`."""
    limits = settings.dead_letter_limits()
    if getattr(settings, "cassandra_contact_points", None):
        return CassandraDeadLetters(
            settings.cassandra_contact_points,
            settings.cassandra_port,
            settings.cassandra_keyspace,
            settings.cassandra_replication,
            settings.cassandra_consistency,
            limits,
        )
    return SqliteDeadLetters((data_dir or settings.data_dir) / "rules_dead_letters.db", limits)
