"""Settings of the queue service (env `STARLING_*`, TOML table `[queue]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class QueueSettings(ServiceSettings):
    service_name: ClassVar[str] = "queue"
    grpc_port: int = Field(default=7003, ge=0, le=65535, description="gRPC port; 0 picks one.")
