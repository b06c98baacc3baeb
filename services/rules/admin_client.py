"""The typed client of the rules admin API (RulesAdminService) for operators and the CLI:
rules (create, list, show with metrics, enable/disable, delete, test) and each rule's dead
letters (list, replay, purge); the tenants' auto-subscriptions. Failures raise
services/common/rpc/errors.py exceptions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.common.rpc.client import LazyStub
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc


class RulesAdminClient:
    def __init__(self, address: str, token: str, timeout_s: float = 30.0) -> None:
        # Replays wait for the actions' retries: a longer deadline than the other admin calls.
        self._rpc = LazyStub(
            address, pb_grpc.RulesAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def create(
        self,
        tenant: str,
        rule_id: str,
        sql: str,
        actions: Sequence[tuple[str, Mapping[str, str]]],
        *,
        enabled: bool = True,
        description: str = "",
    ) -> pb.Rule:
        rule = pb.Rule(
            tenant=tenant,
            rule_id=rule_id,
            sql=sql,
            enabled=enabled,
            description=description,
            actions=[pb.Action(kind=k, params=dict(p)) for k, p in actions],
        )
        resp = await self._rpc.call(self._rpc.stub.CreateRule, pb.CreateRuleRequest(rule=rule))
        return resp.rule

    async def update(
        self,
        tenant: str,
        rule_id: str,
        sql: str,
        actions: Sequence[tuple[str, Mapping[str, str]]],
        *,
        enabled: bool = True,
        description: str = "",
        if_updated_at_ms: int = 0,
    ) -> pb.Rule:
        """Replace a rule's SQL, actions, description and state in place (validated as
        `create` validates); `if_updated_at_ms`: refuse (InvalidArgumentError,
        FAILED_PRECONDITION) if the rule changed since that version."""
        rule = pb.Rule(
            tenant=tenant,
            rule_id=rule_id,
            sql=sql,
            enabled=enabled,
            description=description,
            actions=[pb.Action(kind=k, params=dict(p)) for k, p in actions],
        )
        req = pb.UpdateRuleRequest(rule=rule, if_updated_at_ms=if_updated_at_ms)
        return (await self._rpc.call(self._rpc.stub.UpdateRule, req)).rule

    async def list(self, tenant: str) -> list[pb.Rule]:
        resp = await self._rpc.call(self._rpc.stub.ListRules, pb.ListRulesRequest(tenant=tenant))
        return list(resp.rules)

    async def get(self, tenant: str, rule_id: str) -> pb.GetRuleResponse:
        req = pb.GetRuleRequest(tenant=tenant, rule_id=rule_id)
        return await self._rpc.call(self._rpc.stub.GetRule, req)

    async def set_enabled(self, tenant: str, rule_id: str, enabled: bool) -> pb.Rule:
        req = pb.SetRuleEnabledRequest(tenant=tenant, rule_id=rule_id, enabled=enabled)
        return (await self._rpc.call(self._rpc.stub.SetRuleEnabled, req)).rule

    async def delete(self, tenant: str, rule_id: str) -> bool:
        req = pb.DeleteRuleRequest(tenant=tenant, rule_id=rule_id)
        return bool((await self._rpc.call(self._rpc.stub.DeleteRule, req)).deleted)

    async def test(
        self, tenant: str, message: pb.SampleMessage, *, rule_id: str = "", sql: str = ""
    ) -> pb.TestRuleResponse:
        req = pb.TestRuleRequest(tenant=tenant, rule_id=rule_id, sql=sql, message=message)
        return await self._rpc.call(self._rpc.stub.TestRule, req)

    async def dead_letters(
        self, tenant: str, rule_id: str, after_id: int = 0, limit: int = 100
    ) -> pb.ListDeadLettersResponse:
        req = pb.ListDeadLettersRequest(
            tenant=tenant, rule_id=rule_id, after_id=after_id, limit=limit
        )
        return await self._rpc.call(self._rpc.stub.ListDeadLetters, req)

    async def replay(
        self, tenant: str, rule_id: str, ids: Sequence[int] = ()
    ) -> pb.ReplayDeadLettersResponse:
        req = pb.ReplayDeadLettersRequest(tenant=tenant, rule_id=rule_id, ids=list(ids))
        return await self._rpc.call(self._rpc.stub.ReplayDeadLetters, req)

    async def purge(self, tenant: str, rule_id: str) -> int:
        req = pb.PurgeDeadLettersRequest(tenant=tenant, rule_id=rule_id)
        return int((await self._rpc.call(self._rpc.stub.PurgeDeadLetters, req)).purged)

    async def autosubs(self, tenant: str) -> Sequence[pb.AutoSubscription]:
        req = pb.ListAutoSubscriptionsRequest(tenant=tenant)
        return list((await self._rpc.call(self._rpc.stub.ListAutoSubscriptions, req)).subscriptions)

    async def add_autosub(
        self, tenant: str, filter: str, qos: int
    ) -> Sequence[pb.AutoSubscription]:
        sub = pb.AutoSubscription(filter=filter, qos=qos)
        req = pb.AddAutoSubscriptionRequest(tenant=tenant, subscription=sub)
        return list((await self._rpc.call(self._rpc.stub.AddAutoSubscription, req)).subscriptions)

    async def delete_autosub(self, tenant: str, filter: str) -> bool:
        req = pb.DeleteAutoSubscriptionRequest(tenant=tenant, filter=filter)
        return bool((await self._rpc.call(self._rpc.stub.DeleteAutoSubscription, req)).deleted)

    async def close(self) -> None:
        await self._rpc.close()
