"""Settings of the rules service (env `STARLING_*`, TOML table `[rules]`)."""

from __future__ import annotations

from typing import ClassVar

from services.common.config import ServiceSettings


class RulesSettings(ServiceSettings):
    service_name: ClassVar[str] = "rules"
