"""The installed rules of one rules instance and their evaluation: rules per tenant indexed by
their FROM filters in a topic trie (matching costs what matches, not how many rules a tenant
has), each with its compiled SQL, its actions' deliveries and its counters.

`Engine.process(views)` evaluates a batch of messages and returns once every output was
accepted by its action or dead-lettered (services/rules/actions/delivery.py): only then may
the source messages be acknowledged on the stream."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.common.store.ports_rules import RuleRecord
from services.common.topics.trie import TopicTrie
from services.rules.actions.base import Output
from services.rules.actions.delivery import Delivery
from services.rules.metrics import RuleCounters
from services.rules.sql import CompiledRule, EvalError, MessageView

log = logging.getLogger("starling.rules.engine")


@dataclass(frozen=True, slots=True)
class ActionSpec:
    kind: str
    params: dict[str, str]


def decode_actions(actions_json: str) -> list[ActionSpec]:
    return [ActionSpec(a["kind"], dict(a.get("params") or {})) for a in json.loads(actions_json)]


def encode_actions(actions: Sequence[ActionSpec]) -> str:
    return json.dumps([{"kind": a.kind, "params": a.params} for a in actions], sort_keys=True)


@dataclass(eq=False, slots=True)
class InstalledRule:
    record: RuleRecord
    compiled: CompiledRule
    deliveries: list[Delivery]
    kinds: list[str]
    counters: RuleCounters = field(default_factory=RuleCounters)


class Engine:
    def __init__(self, compile_sql: Callable[[str], CompiledRule]) -> None:
        self.compile = compile_sql
        self._tries: dict[str, TopicTrie[InstalledRule, None]] = {}
        # tenant -> event kind -> rules reading it
        self._events: dict[str, dict[str, list[InstalledRule]]] = {}
        self._rules: dict[tuple[str, str], InstalledRule] = {}

    # ---- what is installed --------------------------------------------------------------

    def get(self, tenant: str, rule_id: str) -> InstalledRule | None:
        return self._rules.get((tenant, rule_id))

    def rules(self) -> list[InstalledRule]:
        return list(self._rules.values())

    def filters(self) -> dict[str, list[str]]:
        """Every tenant's topic filters of enabled rules (what nodes feed the stream with)."""
        out: dict[str, set[str]] = {}
        for r in self._rules.values():
            out.setdefault(r.record.tenant, set()).update(r.compiled.filters)
        return {t: sorted(fs) for t, fs in out.items() if fs}

    def events(self) -> dict[str, list[str]]:
        """Every tenant's client event kinds that enabled rules read."""
        out: dict[str, set[str]] = {}
        for r in self._rules.values():
            if r.compiled.events:
                out.setdefault(r.record.tenant, set()).update(r.compiled.events)
        return {t: sorted(kinds) for t, kinds in out.items()}

    def install(self, rule: InstalledRule) -> None:
        tenant, rid = rule.record.tenant, rule.record.rule_id
        self.remove(tenant, rid)
        self._rules[(tenant, rid)] = rule
        trie = self._tries.setdefault(tenant, TopicTrie())
        for f in rule.compiled.filters:
            trie.add(f, rule, None)
        for kind in rule.compiled.events:
            self._events.setdefault(tenant, {}).setdefault(kind, []).append(rule)

    def remove(self, tenant: str, rule_id: str) -> InstalledRule | None:
        rule = self._rules.pop((tenant, rule_id), None)
        if rule is None:
            return None
        trie = self._tries.get(tenant)
        if trie is not None:
            for f in rule.compiled.filters:
                trie.remove(f, rule)
            if not len(trie):
                del self._tries[tenant]
        kinds = self._events.get(tenant, {})
        for kind in rule.compiled.events:
            kinds[kind] = [r for r in kinds.get(kind, []) if r is not rule]
        return rule

    def match(self, tenant: str, topic: str) -> list[InstalledRule]:
        trie = self._tries.get(tenant)
        if trie is None:
            return []
        hits = trie.match(topic)
        if len(hits) == 1:
            return [hits[0][0]]
        # A rule whose several filters match is one match.
        return list(dict.fromkeys(r for r, _ in hits))

    def match_event(self, tenant: str, kind: str) -> list[InstalledRule]:
        return self._events.get(tenant, {}).get(kind, [])

    # ---- evaluation ---------------------------------------------------------------------

    def evaluate(
        self,
        view: MessageView,
        rules: Sequence[InstalledRule],
        pending: dict[Delivery, list[Output]],
    ) -> None:
        """Run `rules` against `view`; their outputs join `pending`, by delivery."""
        for rule in rules:
            c = rule.counters
            c.matched += 1
            start = time.perf_counter_ns()
            try:
                columns = rule.compiled.apply(view)
            except EvalError as exc:
                c.failed += 1
                c.last_error = str(exc)
                continue
            finally:
                c.add_latency(time.perf_counter_ns() - start)
            if columns is None:
                continue
            c.passed += 1
            if not rule.deliveries:
                continue
            try:
                payload = rule.compiled.encode(columns, view)
            except (TypeError, ValueError) as exc:  # e.g. a NaN the JSON cannot carry
                c.failed += 1
                c.last_error = str(exc)
                continue
            out = Output(
                tenant=view.tenant,
                rule_id=rule.record.rule_id,
                topic=view.topic,
                columns=columns,
                payload=payload,
                qos=view.qos,
                message_id=view.message_id,
                published_at_ms=view.published_at_ms,
                user_properties=view.user_properties,
                clientid=view.clientid,
            )
            for d in rule.deliveries:
                lst = pending.get(d)
                if lst is None:
                    pending[d] = [out]
                else:
                    lst.append(out)

    async def deliver(self, pending: dict[Delivery, list[Output]]) -> None:
        """Hand every output to its delivery; returns once all were sent or dead-lettered,
        raises if any delivery could do neither (the sources must stay unacknowledged)."""
        if not pending:
            return
        deliveries = list(pending)
        outcomes = await asyncio.gather(
            *(d.deliver(pending[d]) for d in deliveries), return_exceptions=True
        )
        failure: BaseException | None = None
        for d, outcome in zip(deliveries, outcomes, strict=True):
            rule = self._rules.get((d.tenant, d.rule_id))
            if isinstance(outcome, BaseException):
                failure = outcome
                continue
            if rule is not None:
                rule.counters.action(int(d.action_name), outcome.delivered, len(pending[d]))
        if failure is not None:
            raise failure
