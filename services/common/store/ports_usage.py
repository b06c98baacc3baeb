"""The usage store's port (`UsageStore`): per-tenant hourly usage and busiest topics, written
by the metrics service, read by analytics; with the summed columns both adapters share. Every
backend passes the contract tests in tests/common/test_store_contract_usage.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one reporter added for one tenant in one hour since its previous report (a row
    of the `usage` table holds the sum of these, `connections` as the hour's maximum)."""

    tenant: str
    hour_ms: int  # start of the hour, epoch ms
    node_id: str
    connections: int  # open at the report
    connection_ms: int
    messages_in: int
    messages_out: int
    dropped: int
    msgs_in_q0: int = 0
    msgs_in_q1: int = 0
    msgs_in_q2: int = 0
    msgs_out_q0: int = 0
    msgs_out_q1: int = 0
    msgs_out_q2: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    quota_refusals: int = 0


# The `usage` columns summed from deltas, in table order after the key and connections_max.
USAGE_SUMMED = (
    "connection_ms",
    "messages_in",
    "messages_out",
    "dropped",
    "msgs_in_q0",
    "msgs_in_q1",
    "msgs_in_q2",
    "msgs_out_q0",
    "msgs_out_q1",
    "msgs_out_q2",
    "bytes_in",
    "bytes_out",
    "quota_refusals",
)


@dataclass(frozen=True, slots=True)
class TopicDelta:
    """Messages a tenant published to a topic within one hour, as estimated by one report's
    top-topics summary (a row of `usage_topics` holds their sum over reporters)."""

    tenant: str
    hour_ms: int
    topic: str
    messages: int


class UsageStore(Protocol):
    """Per-tenant hourly usage, written by the metrics service, read by analytics."""

    async def add(self, deltas: Sequence[UsageDelta], topics: Sequence[TopicDelta] = ()) -> None:
        """Add to the rows (created at zero when missing); `connections` raises the row's
        `connections_max`."""

    async def usage(self, tenant: str) -> list[UsageDelta]:
        """The tenant's rows (connections = connections_max), by hour and reporter."""

    async def topics(self, tenant: str) -> list[TopicDelta]:
        """The tenant's `usage_topics` rows, by hour and topic."""

    async def close(self) -> None: ...
