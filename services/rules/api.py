"""The rules admin API (RulesAdminService): rules per tenant, validated before they are
stored (SQL errors with their position, action params by name), pushed to every rules
instance and node on change, shown with the metrics every instance reports; and each rule's
dead letters (list, replay through the rule's actions, purge)."""

from __future__ import annotations

import asyncio
import re

import grpc
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus.flushing import flushed
from services.common.clock import now_ms
from services.common.rpc.arguments import tenant_argument
from services.common.rpc.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from services.common.store.ports_rules import RuleRecord, RuleStore
from services.common.topics.autosub import check_template
from services.common.topics.rules import topic_matches
from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import DeadLetterStore
from services.rules.actions.delivery import replay
from services.rules.editing import edited
from services.rules.engine import ActionSpec, Engine, decode_actions, encode_actions
from services.rules.metrics import merge
from services.rules.registry import Registry
from services.rules.sql import EvalError, MessageView, RuleSyntaxError
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc

METRICS_SUBJECT = "svc.rules.metrics"
_RULE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_LETTERS_PER_PAGE = 1000


def to_proto(rec: RuleRecord) -> pb.Rule:
    return pb.Rule(
        tenant=rec.tenant,
        rule_id=rec.rule_id,
        sql=rec.sql,
        actions=[pb.Action(kind=a.kind, params=a.params) for a in decode_actions(rec.actions_json)],
        enabled=rec.enabled,
        description=rec.description,
        created_at_ms=rec.created_at_ms,
        updated_at_ms=rec.updated_at_ms,
    )


class RulesAdminApi(pb_grpc.RulesAdminServiceServicer):
    def __init__(
        self,
        store: RuleStore,
        engine: Engine,
        registry: Registry,
        check_context: ActionContext,
        max_rules_per_tenant: int,
        max_actions_per_rule: int,
        dead_letters: DeadLetterStore,
        max_autosubs_per_tenant: int = 64,
    ) -> None:
        self._max_autosubs = max_autosubs_per_tenant
        self._store = store
        self._dead_letters = dead_letters
        self._engine = engine
        self._registry = registry
        self._check_ctx = check_context
        self._max_rules = max_rules_per_tenant
        self._max_actions = max_actions_per_rule
        self.nc: Client | None = None

    # ---- validation ---------------------------------------------------------------------

    @staticmethod
    def _ids(tenant: str, rule_id: str) -> None:
        tenant_argument(tenant)
        if not _RULE_ID.match(rule_id):
            raise InvalidArgumentError(
                "rule_id: 1 to 64 characters among letters, digits, '_', '.', '-'"
            )

    def _check(self, rule: pb.Rule) -> list[ActionSpec]:
        self._engine.compile(rule.sql)  # RuleSyntaxError is a ValueError: INVALID_ARGUMENT
        if len(rule.actions) > self._max_actions:
            raise InvalidArgumentError(
                f"actions: more than {self._max_actions} (rules_max_actions)"
            )
        specs = []
        for i, a in enumerate(rule.actions):
            try:
                # Built only to validate the params; the instances build their own.
                build_action(a.kind, dict(a.params), self._check_ctx)
            except ValueError as exc:
                raise InvalidArgumentError(f"actions[{i}] ({a.kind}): {exc}") from None
            specs.append(ActionSpec(a.kind, dict(a.params)))
        return specs

    # ---- methods ------------------------------------------------------------------------

    async def CreateRule(
        self, request: pb.CreateRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateRuleResponse:
        r = request.rule
        self._ids(r.tenant, r.rule_id)
        specs = self._check(r)
        existing = await self._store.list_rules(r.tenant)
        if any(e.rule_id == r.rule_id for e in existing):
            raise AlreadyExistsError(f"rule {r.rule_id!r} exists in tenant {r.tenant!r}")
        if len(existing) >= self._max_rules:
            raise ResourceExhaustedError(
                f"tenant {r.tenant!r} has {len(existing)} rules (rules_max_per_tenant)"
            )
        now = now_ms()
        rec = RuleRecord(
            r.tenant, r.rule_id, r.sql, encode_actions(specs), r.enabled, now, now, r.description
        )
        await self._store.put_rule(rec)
        await self._registry.changed(r.tenant)
        return pb.CreateRuleResponse(rule=to_proto(rec))

    async def UpdateRule(
        self, request: pb.UpdateRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateRuleResponse:
        r = request.rule
        stored = await self._get(r.tenant, r.rule_id)
        specs = self._check(r)
        rec = edited(
            stored,
            sql=r.sql,
            actions_json=encode_actions(specs),
            enabled=r.enabled,
            description=r.description,
            if_updated_at_ms=request.if_updated_at_ms,
            now_ms=now_ms(),
        )
        await self._store.put_rule(rec)
        await self._registry.changed(r.tenant)
        return pb.UpdateRuleResponse(rule=to_proto(rec))

    async def DeleteRule(
        self, request: pb.DeleteRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteRuleResponse:
        self._ids(request.tenant, request.rule_id)
        deleted = await self._store.delete_rule(request.tenant, request.rule_id)
        if deleted:
            await self._registry.changed(request.tenant)
        return pb.DeleteRuleResponse(deleted=deleted)

    async def ListRules(
        self, request: pb.ListRulesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRulesResponse:
        tenant_argument(request.tenant)
        recs = await self._store.list_rules(request.tenant)
        return pb.ListRulesResponse(rules=[to_proto(r) for r in recs])

    async def _get(self, tenant: str, rule_id: str) -> RuleRecord:
        self._ids(tenant, rule_id)
        rec = await self._store.get_rule(tenant, rule_id)
        if rec is None:
            raise NotFoundError(f"no rule {rule_id!r} in tenant {tenant!r}")
        return rec

    async def GetRule(
        self, request: pb.GetRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRuleResponse:
        rec = await self._get(request.tenant, request.rule_id)
        parts = await self._gather_metrics(request)
        return pb.GetRuleResponse(rule=to_proto(rec), metrics=merge(parts))

    async def SetRuleEnabled(
        self, request: pb.SetRuleEnabledRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetRuleEnabledResponse:
        rec = await self._get(request.tenant, request.rule_id)
        if rec.enabled != request.enabled:
            rec = RuleRecord(
                rec.tenant,
                rec.rule_id,
                rec.sql,
                rec.actions_json,
                request.enabled,
                rec.created_at_ms,
                now_ms(),
                rec.description,
            )
            await self._store.put_rule(rec)
            await self._registry.changed(rec.tenant)
        return pb.SetRuleEnabledResponse(rule=to_proto(rec))

    async def TestRule(
        self, request: pb.TestRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.TestRuleResponse:
        sql = request.sql
        if request.rule_id:
            sql = (await self._get(request.tenant, request.rule_id)).sql
        if not sql:
            raise InvalidArgumentError("rule_id or sql is required")
        try:
            compiled = self._engine.compile(sql)
        except RuleSyntaxError:
            raise
        m = request.message
        view = MessageView(
            request.tenant,
            m.topic,
            m.payload,
            qos=m.qos,
            retain=m.retain,
            clientid=m.client_id,
            username=m.username,
            published_at_ms=m.published_at_ms or now_ms(),
            message_id="test",
            user_properties=tuple(sorted(m.user_properties.items())),
        )
        matched = any(topic_matches(f, m.topic) for f in compiled.filters)
        try:
            columns = compiled.apply(view)
        except EvalError as exc:
            return pb.TestRuleResponse(matched=matched, passed=False, error=str(exc))
        if columns is None:
            return pb.TestRuleResponse(matched=matched, passed=False)
        return pb.TestRuleResponse(
            matched=matched, passed=True, output=compiled.encode(columns, view)
        )

    # ---- dead letters -------------------------------------------------------------------

    async def ListDeadLetters(
        self, request: pb.ListDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDeadLettersResponse:
        self._ids(request.tenant, request.rule_id)
        if request.limit > MAX_LETTERS_PER_PAGE:
            raise InvalidArgumentError(f"limit: at most {MAX_LETTERS_PER_PAGE}")
        letters = await self._dead_letters.list(
            request.tenant, request.rule_id, after_id=request.after_id, limit=request.limit or 100
        )
        stats = await self._dead_letters.stats(request.tenant, request.rule_id)
        if not stats.count and await self._store.get_rule(request.tenant, request.rule_id) is None:
            # A deleted rule's letters stay listable; a rule id that names nothing is an error
            # (a typo used to read as "no dead letters").
            raise NotFoundError(f"no rule {request.rule_id!r} in tenant {request.tenant!r}")
        return pb.ListDeadLettersResponse(
            letters=[
                pb.DeadLetter(
                    id=d.id,
                    action=d.action,
                    topic=d.output.topic,
                    payload=d.output.payload,
                    message_id=d.output.message_id,
                    error=d.error,
                    attempts=d.attempts,
                    failed_at_ms=d.failed_at_ms,
                )
                for d in letters
            ],
            count=stats.count,
            bytes=stats.bytes,
        )

    async def ReplayDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplayDeadLettersResponse:
        self._ids(request.tenant, request.rule_id)
        rule = self._engine.get(request.tenant, request.rule_id)
        if rule is None:
            raise InvalidArgumentError(
                f"rule {request.rule_id!r} is not running here (missing or disabled): enable it "
                "to replay its dead letters",
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        deliveries = {d.action_name: d for d in rule.deliveries}
        result = await replay(
            self._dead_letters, request.tenant, request.rule_id, list(request.ids), deliveries
        )
        return pb.ReplayDeadLettersResponse(
            delivered=result.delivered, failed=result.failed, errors=result.errors
        )

    async def PurgeDeadLetters(
        self, request: pb.PurgeDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.PurgeDeadLettersResponse:
        self._ids(request.tenant, request.rule_id)
        purged = await self._dead_letters.purge(request.tenant, request.rule_id)
        return pb.PurgeDeadLettersResponse(purged=purged)

    # ---- auto-subscriptions -------------------------------------------------------------

    async def _autosubs(self, tenant: str) -> list[pb.AutoSubscription]:
        return [
            pb.AutoSubscription(filter=f, qos=q)
            for _, f, q in await self._store.list_auto_subscriptions(tenant)
        ]

    async def ListAutoSubscriptions(
        self, request: pb.ListAutoSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAutoSubscriptionsResponse:
        tenant_argument(request.tenant)
        return pb.ListAutoSubscriptionsResponse(subscriptions=await self._autosubs(request.tenant))

    async def AddAutoSubscription(
        self, request: pb.AddAutoSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddAutoSubscriptionResponse:
        tenant, sub = request.tenant, request.subscription
        tenant_argument(tenant)
        try:
            check_template(sub.filter, sub.qos)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        existing = await self._store.list_auto_subscriptions(tenant)
        if len(existing) >= self._max_autosubs and all(f != sub.filter for _, f, _ in existing):
            raise ResourceExhaustedError(
                f"tenant {tenant!r} has {len(existing)} auto-subscriptions (autosub_max_per_tenant)"
            )
        await self._store.put_auto_subscription(tenant, sub.filter, sub.qos)
        await self._registry.changed(tenant)
        return pb.AddAutoSubscriptionResponse(subscriptions=await self._autosubs(tenant))

    async def DeleteAutoSubscription(
        self, request: pb.DeleteAutoSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteAutoSubscriptionResponse:
        tenant_argument(request.tenant)
        deleted = await self._store.delete_auto_subscription(request.tenant, request.filter)
        if deleted:
            await self._registry.changed(request.tenant)
        return pb.DeleteAutoSubscriptionResponse(deleted=deleted)

    # ---- metrics over every instance ----------------------------------------------------

    async def _gather_metrics(self, request: pb.GetRuleRequest) -> list[pb.RuleMetrics]:
        """Ask every instance (this one included, over NATS) for its counters of the rule;
        what answers within a short window is summed."""
        if self.nc is None:
            return []
        nc = self.nc
        inbox = nc.new_inbox()
        parts: list[pb.RuleMetrics] = []

        async def got(msg: Msg) -> None:
            parts.append(pb.RuleMetrics.FromString(msg.data))

        sub = await nc.subscribe(inbox, cb=got)
        try:
            await nc.publish(METRICS_SUBJECT, request.SerializeToString(), reply=inbox)
            await flushed(nc, 2)
            await asyncio.sleep(0.3)
        finally:
            await sub.unsubscribe()
        return parts

    async def answer_metrics(self, msg: Msg) -> None:
        req = pb.GetRuleRequest.FromString(msg.data)
        rule = self._engine.get(req.tenant, req.rule_id)
        if rule is None or not msg.reply:
            return
        await msg.respond(rule.counters.to_proto(rule.kinds).SerializeToString())
