"""Composition root of the rules service: the only place that reads the environment."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

import grpc
from nats.aio.client import Client

from services.common.bus.client import connect, drain
from services.common.dependencies import JETSTREAM_UNREACHABLE, wait_for
from services.common.runtime import run_service
from services.common.store.open import open_rule_store
from services.router.client import RouterClient
from services.rules.actions import ActionContext
from services.rules.actions.base import Republished
from services.rules.actions.config import open_dead_letters
from services.rules.api import METRICS_SUBJECT, RulesAdminApi
from services.rules.config import RulesSettings
from services.rules.consumer import StreamConsumer
from services.rules.engine import Engine
from services.rules.metrics import register_rule_metrics
from services.rules.registry import Registry
from services.rules.republisher import MeshRepublisher
from services.rules.sql import compile_rule
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc


class RulesService:
    def __init__(self, settings: RulesSettings) -> None:
        s = self._settings = settings
        self._nc: Client | None = None
        self._store = open_rule_store(s)
        self._dead_letters = open_dead_letters(s)
        self._router = RouterClient(s.router_addr)
        self.engine = Engine(partial(compile_rule, limits=s.sql_limits()))
        self._republisher: MeshRepublisher | None = None
        self.registry = Registry(
            self._store,
            self.engine,
            self._dead_letters,
            self._context,
            s.retry_policy(),
            s.action_max_pending_outputs,
        )
        self.api = RulesAdminApi(
            self._store,
            self.engine,
            self.registry,
            ActionContext(republisher=_NoRepublish(), nats=None, data_dir=s.data_dir),
            s.rules_max_per_tenant,
            s.rules_max_actions,
            self._dead_letters,
            s.autosub_max_per_tenant,
        )
        self.consumer: StreamConsumer | None = None

    def _context(self, tenant: str, rule_id: str) -> ActionContext:
        assert self._republisher is not None
        return ActionContext(
            republisher=self._republisher,
            nats=self._nc,
            data_dir=self._settings.data_dir,
            tenant=tenant,
            rule_id=rule_id,
        )

    def register(self, server: grpc.aio.Server) -> Iterable[str]:
        pb_grpc.add_RulesAdminServiceServicer_to_server(self.api, server)
        return [s.full_name for s in pb.DESCRIPTOR.services_by_name.values()]

    async def start(self) -> None:
        s = self._settings
        self._nc = nc = await connect(s.nats_url, s.node_id, **s.nats_options())
        self._republisher = MeshRepublisher(nc, self._router, s.node_id)
        self.api.nc = nc
        await nc.subscribe(METRICS_SUBJECT, cb=self.api.answer_metrics)
        self.consumer = StreamConsumer(
            nc,
            self.engine,
            batch=s.rules_fetch_batch,
            ack_wait_s=s.rules_ack_wait_s,
            max_age_s=s.rules_stream_max_age_s,
            max_bytes=s.rules_stream_max_bytes,
            refresh=self.registry.reload,
            replicas=s.nats_stream_replicas,
        )
        # The stream exists before any node learns a filter (nodes store into it only then),
        # and the rules are installed before the first message is pulled (one pulled before
        # would match nothing and be acknowledged: lost for its rules).
        js_down = JETSTREAM_UNREACHABLE
        await wait_for("jetstream", self.consumer.prepare, s.dependency_wait_s, js_down)
        await self.registry.start(nc)
        await wait_for("jetstream", self.consumer.start, s.dependency_wait_s, js_down)
        register_rule_metrics(
            lambda: [(r.record.tenant, r.record.rule_id, r.counters) for r in self.engine.rules()]
        )

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        await self.registry.stop()
        if self._nc is not None:
            await drain(self._nc)
        await self._router.close()
        await self._dead_letters.close()
        await self._store.close()


class _NoRepublish:
    """The republisher lent to actions built only to validate their params."""

    async def publish(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        user_properties: tuple[tuple[str, str], ...],
    ) -> None:
        raise RuntimeError("validation only")

    async def publish_many(self, messages: Sequence[Republished]) -> None:
        raise RuntimeError("validation only")


def main() -> int:
    return run_service("rules", RulesSettings, RulesService)
