"""Settings of the rules service (env `STARLING_*`, TOML table `[rules]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings
from services.rules.actions.config import ActionSettings
from services.rules.sql import SqlLimits


class RulesSettings(ServiceSettings, ActionSettings):
    service_name: ClassVar[str] = "rules"
    grpc_port: int = Field(default=7004, ge=0, le=65535, description="gRPC port; 0 picks one.")
    rules_max_per_tenant: int = Field(
        default=10_000,
        ge=1,
        description="Rules one tenant may have; CreateRule beyond it answers RESOURCE_EXHAUSTED.",
    )
    autosub_max_per_tenant: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Auto-subscription filters one tenant may have (each applies to every "
        "client at connect); AddAutoSubscription beyond it answers RESOURCE_EXHAUSTED.",
    )
    rules_max_actions: int = Field(
        default=16, ge=1, le=256, description="Actions one rule may have."
    )
    rules_max_sql_bytes: int = Field(
        default=16384, ge=64, le=1 << 20, description="Longest rule SQL accepted."
    )
    rules_max_depth: int = Field(
        default=40,
        ge=4,
        le=200,
        description="Deepest expression nesting a rule may have (parentheses, function calls, "
        "operator chains): bounds the parser's and the evaluator's stack.",
    )
    rules_max_filters: int = Field(
        default=16, ge=1, le=1024, description="Topic filters in one FROM."
    )
    rules_max_columns: int = Field(default=64, ge=1, le=4096, description="Columns in one SELECT.")
    rules_max_string_bytes: int = Field(
        default=1 << 20,
        ge=1024,
        description="Longest string a rule may build for one message (concat, pad, ...); "
        "longer fails that message for that rule.",
    )
    rules_fetch_batch: int = Field(
        default=256,
        ge=1,
        le=10_000,
        description="Messages one instance pulls from the RULES stream at once (acknowledged "
        "together once their outputs are delivered).",
    )
    rules_ack_wait_s: float = Field(
        default=10.0,
        ge=1,
        le=3600,
        description="A pulled batch not acknowledged within this time (its instance died) is "
        "delivered again, to any instance: how long a killed instance's batch waits. A live "
        "instance whose actions are slow marks its batch in progress every third of it, so "
        "a slow target causes no redelivery. Set when the RULES and EVENTS consumers are "
        "first created (an existing JetStream store keeps its consumers' value).",
    )
    rules_stream_max_age_s: float = Field(
        default=0.0,
        ge=0,
        description="0 (the default): messages wait in the RULES stream until a rule saw "
        "them, however long the rules service is down (max_bytes bounds the stream). A "
        "positive value deletes messages older than this although their publishers were "
        "acknowledged and no rule has seen them; set one only where a late rule output is "
        "worse than a lost one. Applied to an existing stream when the service starts.",
    )
    rules_stream_max_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="Bytes the RULES stream holds. When full it refuses new messages (never "
        "drops stored ones) and nodes answer the QoS>=1 publishes a rule reads with 0x97 "
        "quota exceeded (MQTT 3.1.1: the connection closes unacknowledged) until the rules "
        "service drains it. Applied to an existing stream when the service starts.",
    )

    def sql_limits(self) -> SqlLimits:
        return SqlLimits(
            max_sql_bytes=self.rules_max_sql_bytes,
            max_depth=self.rules_max_depth,
            max_filters=self.rules_max_filters,
            max_columns=self.rules_max_columns,
            max_string_bytes=self.rules_max_string_bytes,
        )
