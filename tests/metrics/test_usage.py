"""Usage deltas from the nodes' cumulative reports: differences per report, connection time
from the previous report's open connections, a restarted node counted from zero, the hour of
the report."""

from __future__ import annotations

from services.metrics.core import TenantCounts
from services.metrics.usage import HOUR_MS, UsageTracker

T0 = 1_000 * HOUR_MS  # the start of an hour


def test_deltas_between_reports_and_connection_time() -> None:
    u = UsageTracker()
    first = u.deltas("n1", T0 + 1000, {"a": TenantCounts(2, 5, 4, 0), "": TenantCounts(1)})
    assert [(d.tenant, d.messages_in, d.messages_out, d.connection_ms) for d in first] == [
        ("a", 5, 4, 0)
    ]  # the first report of a node brings no connection time; "" is no tenant
    second = u.deltas("n1", T0 + 3000, {"a": TenantCounts(1, 7, 10, 1)})
    (d,) = second
    assert (d.messages_in, d.messages_out, d.dropped) == (2, 6, 1)
    assert d.connection_ms == 2 * 2000 and d.connections == 1 and d.hour_ms == T0


def test_a_restarted_node_counts_from_zero_and_nodes_are_apart() -> None:
    u = UsageTracker()
    u.deltas("n1", T0, {"a": TenantCounts(0, 50, 50, 0)})
    u.deltas("n2", T0, {"a": TenantCounts(0, 7, 0, 0)})
    (d,) = u.deltas("n1", T0 + HOUR_MS + 5, {"a": TenantCounts(0, 3, 2, 0)})
    assert (d.messages_in, d.messages_out, d.hour_ms) == (3, 2, T0 + HOUR_MS)
    assert u.deltas("n2", T0 + 10, {"a": TenantCounts(0, 7, 0, 0)}) == []  # nothing new


def test_per_qos_bytes_and_refusals_are_deltas_too_and_topics_go_to_the_hour() -> None:
    from services.metrics.usage import topic_counts

    u = UsageTracker()
    first = TenantCounts(1, 5, 0, 0, msgs_in_q1=5, bytes_in=500, quota_refusals=2)
    u.deltas("n1", T0, {"a": first})
    later = TenantCounts(
        1, 9, 3, 0, msgs_in_q1=6, msgs_in_q2=3, msgs_out_q0=3, bytes_in=900, bytes_out=30,
        quota_refusals=7, top_topics=(("x/y", 16),),
    )  # fmt: skip
    (d,) = u.deltas("n1", T0 + 10, {"a": later})
    assert (d.msgs_in_q0, d.msgs_in_q1, d.msgs_in_q2, d.msgs_out_q0) == (0, 1, 3, 3)
    assert (d.bytes_in, d.bytes_out, d.quota_refusals) == (400, 30, 5)
    (t,) = topic_counts(T0 + 10, {"a": later, "": later})
    assert (t.tenant, t.hour_ms, t.topic, t.messages) == ("a", T0, "x/y", 16)
