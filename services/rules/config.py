"""Settings of the rules service (env `STARLING_*`, TOML table `[rules]`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.common.config import ServiceSettings


class RulesSettings(ServiceSettings):
    service_name: ClassVar[str] = "rules"
    grpc_port: int = Field(default=7004, ge=0, le=65535, description="gRPC port; 0 picks one.")
