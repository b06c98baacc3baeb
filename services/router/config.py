"""Settings of the router service (env `STARLING_*`, TOML table `[router]`)."""

from __future__ import annotations

from typing import ClassVar

from services.common.config import ServiceSettings


class RouterSettings(ServiceSettings):
    service_name: ClassVar[str] = "router"
