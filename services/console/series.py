"""The samples behind the overview's charts (pure: no I/O): what one sample holds for the
cluster and for one tenant, their JSON form in Redis, and the per-second rates between
consecutive samples.

Counters in a sample are cumulative (as the nodes report them); rates are computed when a
page is drawn. A counter that went down between two samples (a node restarted or stopped
reporting) gives a rate of 0 for that interval, never a negative one."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Counts:
    """Figures at one moment: connections and persistent sessions (gauges), messages in,
    out and dropped (cumulative counters)."""

    connections: int = 0
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0
    sessions: int = 0

    def as_list(self) -> list[int]:
        return [self.connections, self.messages_in, self.messages_out, self.dropped, self.sessions]

    @staticmethod
    def from_list(values: Sequence[int]) -> Counts:
        c, i, o, d, s = (list(values) + [0] * 5)[:5]
        return Counts(connections=c, messages_in=i, messages_out=o, dropped=d, sessions=s)


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceHealth:
    """One service instance as the sampler found it: its gRPC health ("SERVING",
    "NOT_SERVING", "UNREACHABLE", ...) and, for a connection node, its own figures."""

    name: str
    service: str
    status: str
    counts: Counts | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSample:
    at_ms: int
    nodes_reporting: int  # connection nodes whose report the metrics service counts
    totals: Counts  # every tenant summed
    instances: tuple[InstanceHealth, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantSample:
    at_ms: int
    counts: Counts


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    """Per-second rates over the interval that ends at `at_ms`."""

    at_ms: int
    messages_in: float
    messages_out: float
    dropped: float


def encode_cluster(s: ClusterSample) -> str:
    return json.dumps(
        {
            "t": s.at_ms,
            "n": s.nodes_reporting,
            "c": s.totals.as_list(),
            "i": [
                [i.name, i.service, i.status, i.counts.as_list() if i.counts else None]
                for i in s.instances
            ],
        },
        separators=(",", ":"),
    )


def decode_cluster(raw: str | bytes) -> ClusterSample:
    d = json.loads(raw)
    return ClusterSample(
        at_ms=int(d["t"]),
        nodes_reporting=int(d["n"]),
        totals=Counts.from_list(d["c"]),
        instances=tuple(
            InstanceHealth(
                name=name,
                service=service,
                status=status,
                counts=Counts.from_list(counts) if counts is not None else None,
            )
            for name, service, status, counts in d["i"]
        ),
    )


def encode_tenant(s: TenantSample) -> str:
    return json.dumps({"t": s.at_ms, "c": s.counts.as_list()}, separators=(",", ":"))


def decode_tenant(raw: str | bytes) -> TenantSample:
    d = json.loads(raw)
    return TenantSample(at_ms=int(d["t"]), counts=Counts.from_list(d["c"]))


def _per_s(before: int, after: int, dt_s: float) -> float:
    return max(0, after - before) / dt_s


def rates(points: Sequence[tuple[int, Counts]]) -> list[Rate]:
    """Rates between consecutive (at_ms, counts) points, oldest first; one fewer than the
    points."""
    out = []
    for (t0, a), (t1, b) in itertools.pairwise(points):
        dt_s = (t1 - t0) / 1000
        if dt_s <= 0:
            continue
        out.append(
            Rate(
                at_ms=t1,
                messages_in=_per_s(a.messages_in, b.messages_in, dt_s),
                messages_out=_per_s(a.messages_out, b.messages_out, dt_s),
                dropped=_per_s(a.dropped, b.dropped, dt_s),
            )
        )
    return out


def node_points(samples: Sequence[ClusterSample], name: str) -> list[tuple[int, Counts]]:
    """One instance's figures over the samples that have them."""
    out = []
    for s in samples:
        for i in s.instances:
            if i.name == name and i.counts is not None:
                out.append((s.at_ms, i.counts))
    return out
