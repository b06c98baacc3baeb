"""Settings of the queue service (env `STARLING_*`, TOML table `[queue]`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from services.common.config import ServiceSettings


class QueueSettings(ServiceSettings):
    service_name: ClassVar[str] = "queue"
    grpc_port: int = Field(default=7003, ge=0, le=65535, description="gRPC port; 0 picks one.")
    queue_partitions: int = Field(default=64, ge=1, le=65536, description="Fixed partition count.")
    instance_ordinal: int = Field(default=0, ge=0, description="This instance's index.")
    instance_count: int = Field(default=1, ge=1, description="Queue instances in the cluster.")
    max_queue_depth: int = Field(
        default=1_000_000,
        ge=0,
        description="Entries per session queue; 0: no cap. Past it `depth_policy` applies.",
    )
    depth_policy: Literal["drop_oldest", "reject_newest"] = "drop_oldest"
    notice_max_bytes: int = Field(
        default=65536,
        ge=0,
        le=1_048_576,
        description="Largest total size of an append's new entries that the queue pushes, "
        "inside its notice, to a reader that is caught up (saves that reader a read); larger "
        "appends are read back. 0: never push.",
    )

    @model_validator(mode="after")
    def _ordinal(self) -> QueueSettings:
        if self.instance_ordinal >= self.instance_count:
            raise ValueError("instance_ordinal must be below instance_count")
        return self
