"""Editing a stored rule in place (UpdateRule): the new SQL, actions, description and enabled
flag replace the old under the same id, keeping its creation time (and so its dead letters,
which are keyed by tenant and rule id). An edit that started from an older version of the rule
is refused rather than silently overwriting someone else's change."""

from __future__ import annotations

import dataclasses

import grpc

from services.common.rpc.errors import InvalidArgumentError
from services.common.store.ports_rules import RuleRecord


def edited(
    stored: RuleRecord,
    *,
    sql: str,
    actions_json: str,
    enabled: bool,
    description: str,
    if_updated_at_ms: int,
    now_ms: int,
) -> RuleRecord:
    """The stored rule with the edit applied; FAILED_PRECONDITION when `if_updated_at_ms` is
    set and is not the stored rule's version (the check and the write are not atomic: two
    edits racing within one store round trip can still both land, last write wins)."""
    if if_updated_at_ms and if_updated_at_ms != stored.updated_at_ms:
        raise InvalidArgumentError(
            f"rule {stored.rule_id!r} was changed since this edit began (updated at "
            f"{stored.updated_at_ms}, edit from {if_updated_at_ms}): reload it",
            code=grpc.StatusCode.FAILED_PRECONDITION,
        )
    return dataclasses.replace(
        stored,
        sql=sql,
        actions_json=actions_json,
        enabled=enabled,
        description=description,
        # Strictly later, so a second edit from the same page is seen as stale even within
        # one millisecond.
        updated_at_ms=max(now_ms, stored.updated_at_ms + 1),
    )
