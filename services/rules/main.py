"""Composition root of the rules service: the only place that reads the environment."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from nats.aio.client import Client

from services.common.bus.client import connect
from services.common.runtime import run_service
from services.rules.config import RulesSettings


class RulesService:
    def __init__(self, settings: RulesSettings) -> None:
        self._settings = settings
        self._nc: Client | None = None

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        return []

    async def start(self) -> None:
        self._nc = await connect(
            self._settings.nats_url, self._settings.node_id, **self._settings.nats_credentials()
        )

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.drain()


def main() -> int:
    return run_service("rules", RulesSettings, RulesService)
