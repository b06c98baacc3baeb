"""Settings of the queue service (env `STARLING_*`, TOML table `[queue]`)."""

from __future__ import annotations

from typing import ClassVar

from services.common.config import ServiceSettings


class QueueSettings(ServiceSettings):
    service_name: ClassVar[str] = "queue"
