"""The rule store's port (`RuleStore`): the tenants' rules and auto-subscription filters,
kept by the rules service. Every backend passes the contract tests in
tests/common/test_store_contract_rules.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RuleRecord:
    """A tenant's rule as stored (issue 17): its SQL and actions, compiled by each rules
    service instance that loads it. `actions_json` is a JSON list of {"kind", "params"}."""

    tenant: str
    rule_id: str
    sql: str
    actions_json: str
    enabled: bool
    created_at_ms: int
    updated_at_ms: int
    description: str = ""


class RuleStore(Protocol):
    """Rules per tenant, kept by the rules service."""

    async def put_rule(self, record: RuleRecord) -> None: ...

    async def get_rule(self, tenant: str, rule_id: str) -> RuleRecord | None: ...

    async def list_rules(self, tenant: str | None = None) -> list[RuleRecord]:
        """Every rule, or those of `tenant`, ordered by (tenant, rule_id)."""

    async def delete_rule(self, tenant: str, rule_id: str) -> bool: ...

    async def put_auto_subscription(self, tenant: str, filter: str, qos: int) -> None:
        """Add (or set the QoS of) one of `tenant`'s auto-subscription filters."""

    async def delete_auto_subscription(self, tenant: str, filter: str) -> bool: ...

    async def list_auto_subscriptions(
        self, tenant: str | None = None
    ) -> list[tuple[str, str, int]]:
        """(tenant, filter, qos) of every tenant's, or `tenant`'s, ordered by tenant, filter."""

    async def close(self) -> None: ...
