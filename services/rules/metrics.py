"""Per-rule counters (matched, passed, failed, per-action success/failure, evaluation
latency), kept per rules instance, summed over instances for `starling rules show`, and
exported on the instance's Prometheus endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from starling.rules.v1 import rules_pb2 as pb


@dataclass(slots=True)
class RuleCounters:
    matched: int = 0
    passed: int = 0
    failed: int = 0
    latency_ns_total: int = 0
    latency_ns_max: int = 0
    last_error: str = ""
    # per action index: [outputs delivered, outputs dead-lettered]
    actions: dict[int, list[int]] = field(default_factory=dict)

    def add_latency(self, ns: int) -> None:
        self.latency_ns_total += ns
        if ns > self.latency_ns_max:
            self.latency_ns_max = ns

    def action(self, index: int, delivered: bool, n: int) -> None:
        slot = self.actions.setdefault(index, [0, 0])
        slot[0 if delivered else 1] += n

    def to_proto(self, kinds: list[str]) -> pb.RuleMetrics:
        m = pb.RuleMetrics(
            matched=self.matched,
            passed=self.passed,
            failed=self.failed,
            latency_avg_us=self.latency_ns_total / self.matched / 1000 if self.matched else 0.0,
            latency_max_us=self.latency_ns_max / 1000,
            instances=1,
        )
        for i, kind in enumerate(kinds):
            ok, bad = self.actions.get(i, [0, 0])
            m.actions.add(kind=kind, success=ok, failure=bad)
        return m


def merge(parts: Iterable[pb.RuleMetrics]) -> pb.RuleMetrics:
    """Sum the metrics several instances reported for one rule."""
    out = pb.RuleMetrics()
    total_latency = 0.0
    for p in parts:
        out.matched += p.matched
        out.passed += p.passed
        out.failed += p.failed
        out.instances += p.instances
        total_latency += p.latency_avg_us * p.matched
        out.latency_max_us = max(out.latency_max_us, p.latency_max_us)
        for i, a in enumerate(p.actions):
            if i >= len(out.actions):
                out.actions.add(kind=a.kind)
            out.actions[i].success += a.success
            out.actions[i].failure += a.failure
    out.latency_avg_us = total_latency / out.matched if out.matched else 0.0
    return out


def register_rule_metrics(rules: Callable[[], Iterable[tuple[str, str, RuleCounters]]]) -> None:
    """Observable counters on the Prometheus endpoint, one series per (tenant, rule)."""
    meter = metrics.get_meter("starling.rules")

    def observe(
        pick: Callable[[RuleCounters], int],
    ) -> Callable[[CallbackOptions], list[Observation]]:
        def cb(_: CallbackOptions) -> list[Observation]:
            return [Observation(pick(c), {"tenant": t, "rule": r}) for t, r, c in rules()]

        return cb

    for name, pick, what in (
        ("starling.rules.matched", lambda c: c.matched, "messages whose topic a rule reads"),
        ("starling.rules.passed", lambda c: c.passed, "messages a rule's WHERE kept"),
        ("starling.rules.failed", lambda c: c.failed, "messages a rule could not evaluate"),
        (
            "starling.rules.eval_ns",
            lambda c: c.latency_ns_total,
            "time spent evaluating the rule, nanoseconds",
        ),
    ):
        meter.create_observable_counter(name, callbacks=[observe(pick)], description=what)

    def per_action(slot: int) -> Callable[[CallbackOptions], list[Observation]]:
        # One series per action of each rule: `action` is its index in the rule.
        def cb(_: CallbackOptions) -> list[Observation]:
            return [
                Observation(counts[slot], {"tenant": t, "rule": r, "action": str(i)})
                for t, r, c in rules()
                for i, counts in sorted(c.actions.items())
            ]

        return cb

    meter.create_observable_counter(
        "starling.rules.action_success",
        callbacks=[per_action(0)],
        description="outputs the action accepted",
    )
    meter.create_observable_counter(
        "starling.rules.action_failure",
        callbacks=[per_action(1)],
        description="outputs the action dead-lettered after its retries",
    )
    meter.create_observable_gauge(
        "starling.rules.eval_max_ns",
        callbacks=[observe(lambda c: c.latency_ns_max)],
        description="longest evaluation of one message by the rule, nanoseconds",
    )
