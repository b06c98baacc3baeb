"""Keeps one rules instance's installed rules (and the tenants' auto-subscriptions) equal to the
store: everything at start, one tenant again whenever any instance changed it
(`ctl.rules.filters` names the tenant), and builds each installed rule's actions and
deliveries. It also answers the nodes' requests for every tenant's filters, auto-subscriptions
and node-emitted events their rules read, and tells them (and the other instances) of a
tenant's change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.common.store.ports_rules import RuleRecord, RuleStore
from services.common.topics.autosub import AutoSubscription
from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import DeadLetterStore
from services.rules.actions.delivery import Delivery, RetryPolicy
from services.rules.engine import Engine, InstalledRule, decode_actions
from services.rules.sql.parse import NODE_EVENTS
from starling.rules.v1 import rules_pb2 as pb

log = logging.getLogger("starling.rules.registry")


class Registry:
    def __init__(
        self,
        store: RuleStore,
        engine: Engine,
        dead_letters: DeadLetterStore,
        context: Callable[[str, str], ActionContext],
        retry: RetryPolicy,
        max_pending: int,
    ) -> None:
        self._store = store
        self._engine = engine
        self._dead_letters = dead_letters
        self._context = context
        self._retry = retry
        self._max_pending = max_pending
        self._lock = asyncio.Lock()
        self._nc: Client | None = None
        self._autosubs: dict[str, tuple[AutoSubscription, ...]] = {}

    async def start(self, nc: Client) -> None:
        self._nc = nc
        async with self._lock:
            for rec in await self._store.list_rules():
                if rec.enabled:
                    await self._install(rec)
            by_tenant: dict[str, list[AutoSubscription]] = {}
            for tenant, f, qos in await self._store.list_auto_subscriptions():
                by_tenant.setdefault(tenant, []).append(AutoSubscription(f, qos))
            self._autosubs = {t: tuple(subs) for t, subs in by_tenant.items()}
        await nc.subscribe(subjects.RULE_FILTERS_CHANGED, cb=self._on_change)
        await nc.subscribe(subjects.RULE_FILTERS_REQUEST, queue="rules", cb=self._on_request)
        # Nodes started before this instance learn every tenant's filters now.
        for tenant_filters in self.snapshot().tenants:
            await nc.publish(subjects.RULE_FILTERS_CHANGED, tenant_filters.SerializeToString())

    def auto_subscriptions(self, tenant: str) -> tuple[AutoSubscription, ...]:
        return self._autosubs.get(tenant, ())

    def tenant_filters(self, tenant: str) -> pb.TenantFilters:
        """What nodes need of `tenant`: its rules' filters, its auto-subscriptions and the
        client events they emit for its rules."""
        events = [e for e in self._engine.events().get(tenant, []) if e in NODE_EVENTS]
        return pb.TenantFilters(
            tenant=tenant,
            filters=self._engine.filters().get(tenant, []),
            auto_subscriptions=[
                pb.AutoSubscription(filter=a.filter, qos=a.qos)
                for a in self._autosubs.get(tenant, ())
            ],
            events=events,
        )

    def snapshot(self) -> pb.FilterSnapshot:
        tenants = set(self._engine.filters()) | set(self._autosubs) | set(self._engine.events())
        return pb.FilterSnapshot(tenants=[self.tenant_filters(t) for t in sorted(tenants)])

    async def stop(self) -> None:
        for rule in self._engine.rules():
            self._engine.remove(rule.record.tenant, rule.record.rule_id)
            await _close(rule)

    async def changed(self, tenant: str) -> None:
        """A rule of `tenant` changed here: install the change, then tell nodes and the
        other instances (they reload the tenant from the store)."""
        await self.reload(tenant)
        assert self._nc is not None
        await self._nc.publish(
            subjects.RULE_FILTERS_CHANGED, self.tenant_filters(tenant).SerializeToString()
        )
        await flushed(self._nc, 5)

    async def reload(self, tenant: str) -> None:
        async with self._lock:
            stored = {r.rule_id: r for r in await self._store.list_rules(tenant) if r.enabled}
            installed = {
                r.record.rule_id: r for r in self._engine.rules() if r.record.tenant == tenant
            }
            for rid, rule in installed.items():
                rec = stored.get(rid)
                if rec is None or rec != rule.record:
                    self._engine.remove(tenant, rid)
                    await _close(rule)
            for rid, rec in stored.items():
                current = self._engine.get(tenant, rid)
                if current is None:
                    await self._install(rec)
            autosubs = await self._store.list_auto_subscriptions(tenant)
            if autosubs:
                self._autosubs[tenant] = tuple(AutoSubscription(f, q) for _, f, q in autosubs)
            else:
                self._autosubs.pop(tenant, None)

    async def _install(self, rec: RuleRecord) -> None:
        try:
            compiled = self._engine.compile(rec.sql)
            specs = decode_actions(rec.actions_json)
            deliveries = []
            ctx = self._context(rec.tenant, rec.rule_id)
            for i, spec in enumerate(specs):
                action = build_action(spec.kind, spec.params, ctx)
                d = Delivery(
                    action,
                    rec.tenant,
                    rec.rule_id,
                    self._dead_letters,
                    self._retry,
                    action_name=str(i),
                    max_pending=self._max_pending,
                )
                await d.start()
                deliveries.append(d)
        except Exception:
            # The API validated it before storing, so this is an action that cannot start
            # (its target unreachable at start) or a rule from another version: logged, and
            # the rule runs on no message until it is changed or this instance restarts.
            log.exception("rule_install_failed", extra={"tenant": rec.tenant, "rule": rec.rule_id})
            return
        old = self._engine.get(rec.tenant, rec.rule_id)
        counters = old.counters if old is not None else None
        rule = InstalledRule(rec, compiled, deliveries, [s.kind for s in specs])
        if counters is not None:
            rule.counters = counters
        self._engine.install(rule)

    async def _on_change(self, msg: Msg) -> None:
        tenant = pb.TenantFilters.FromString(msg.data).tenant
        try:
            await self.reload(tenant)
        except Exception:
            log.exception("rules_reload_failed", extra={"tenant": tenant})

    async def _on_request(self, msg: Msg) -> None:
        await msg.respond(self.snapshot().SerializeToString())


async def _close(rule: InstalledRule) -> None:
    for d in rule.deliveries:
        try:
            await d.close()
        except Exception:
            log.exception("delivery_close_failed", extra={"rule": rule.record.rule_id})
