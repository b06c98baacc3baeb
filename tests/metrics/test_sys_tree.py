"""The `$SYS/broker` tree of one tenant (services/metrics/sys_tree.py): Mosquitto 2.0's names,
values published only when they change, the load averages' arithmetic, and the operator's
view of the cluster."""

from __future__ import annotations

import math
from pathlib import Path

from services.metrics.core import ClusterStats, TenantCounts
from services.metrics.sys_publisher import views
from services.metrics.sys_tree import SysTree, names

ROOT = Path(__file__).resolve().parents[2]


def _figures(**kw: int) -> TenantCounts:
    return TenantCounts(**kw)


def test_all_53_mosquitto_names_are_listed_once_and_documented() -> None:
    listed = names()
    assert len(listed) == 53 == len(set(listed))
    doc = (ROOT / "docs" / "metrics.md").read_text()
    missing = [n for n in listed if f"`{n}`" not in doc]
    assert not missing, f"docs/metrics.md does not list {missing}"


def test_first_update_publishes_every_value_and_zero_loads() -> None:
    tree = SysTree("1.2.3")
    c = _figures(connections=3, sessions_persistent=5, sessions_persistent_online=1)
    out = dict(tree.update(c, now=100.0, uptime_s=42.7))
    assert out["$SYS/broker/version"] == b"starling version 1.2.3"
    assert out["$SYS/broker/clients/connected"] == b"3"
    assert out["$SYS/broker/clients/active"] == b"3"
    assert out["$SYS/broker/clients/disconnected"] == b"4"
    assert out["$SYS/broker/clients/total"] == b"7"
    assert out["$SYS/broker/clients/maximum"] == b"7"
    assert out["$SYS/broker/uptime"] == b"42 seconds"
    assert out["$SYS/broker/load/connections/15min"] == b"0.00"
    heap = {"$SYS/broker/heap/current", "$SYS/broker/heap/maximum"}
    assert set(out) == set(names()) - heap  # memory is the operator tenant's only
    operator = dict(SysTree("1.2.3").update(c, now=100.0, uptime_s=42.7, memory_bytes=7 << 20))
    assert set(operator) == set(names())
    assert operator["$SYS/broker/heap/current"] == str(7 << 20).encode()


def test_shared_subscriptions_are_counted_apart_from_the_others() -> None:
    out = dict(SysTree("1").update(_figures(subscriptions=5, subscriptions_shared=2), 0.0, 0.0))
    assert out["$SYS/broker/subscriptions/count"] == b"3"
    assert out["$SYS/broker/shared_subscriptions/count"] == b"2"


def test_heap_maximum_is_the_largest_heap_seen() -> None:
    tree = SysTree("1")
    tree.update(_figures(), 0.0, 0.0, memory_bytes=1000)
    out = dict(tree.update(_figures(), 1.0, 1.0, memory_bytes=800))
    assert out["$SYS/broker/heap/current"] == b"800"
    assert "$SYS/broker/heap/maximum" not in out
    out = dict(tree.update(_figures(), 2.0, 2.0, memory_bytes=1200))
    assert (out["$SYS/broker/heap/current"], out["$SYS/broker/heap/maximum"]) == (b"1200",) * 2


def test_cluster_memory_sums_every_live_reporter_of_every_kind() -> None:
    stats = ClusterStats(stale_s=10)
    stats.report("node-0", 0.0, {}, "", memory_bytes=100)
    stats.report("router-0", 5.0, {}, "router", memory_bytes=20)
    stats.report("router-1", 5.0, {}, "router", memory_bytes=30)  # each instance's own
    stats.report("queue-0", 5.0, {}, "queue", memory_bytes=4)
    assert stats.memory_bytes(9.0) == 154
    assert stats.memory_bytes(12.0) == 54  # node-0 went silent


def test_unchanged_figures_of_an_idle_tenant_publish_nothing() -> None:
    tree = SysTree("1")
    c = _figures(retained_messages=2)
    tree.update(c, 0.0, 0.0)
    assert tree.update(c, 10.0, 10.0) == []


def test_a_connected_tenant_gets_its_uptime_and_changed_values_only() -> None:
    tree = SysTree("1")
    tree.update(_figures(connections=1, messages_in=5), 0.0, 0.0)
    out = dict(tree.update(_figures(connections=1, messages_in=9), 10.0, 10.0))
    assert out["$SYS/broker/publish/messages/received"] == b"9"
    assert out["$SYS/broker/uptime"] == b"10 seconds"
    assert "$SYS/broker/clients/connected" not in out
    assert "$SYS/broker/version" not in out


def test_load_is_mosquittos_moving_average_of_the_per_minute_rate() -> None:
    tree = SysTree("1")
    tree.update(_figures(messages_in=0), 0.0, 0.0)
    out = dict(tree.update(_figures(messages_in=100), 10.0, 10.0))
    rate = 100 * 60 / 10  # per minute
    for period, span in (("1min", 60), ("5min", 300), ("15min", 900)):
        want = rate + math.exp(-10 / span) * (0 - rate)
        assert out[f"$SYS/broker/load/publish/received/{period}"] == f"{want:.2f}".encode()
    # A sum that went down (a node stopped reporting) is no negative rate: the loads decay.
    out = dict(tree.update(_figures(messages_in=40), 20.0, 20.0))
    one_min = float(out["$SYS/broker/load/publish/received/1min"])
    assert 0 < one_min < rate * (1 - math.exp(-10 / 60))


def test_maximum_only_grows() -> None:
    tree = SysTree("1")
    tree.update(_figures(connections=4), 0.0, 0.0)
    out = dict(tree.update(_figures(connections=2), 1.0, 1.0))
    assert "$SYS/broker/clients/maximum" not in out
    out = dict(tree.update(_figures(connections=6), 2.0, 2.0))
    assert out["$SYS/broker/clients/maximum"] == b"6"


def test_operator_tenant_sees_the_cluster_and_nobody_sees_unauthenticated() -> None:
    totals = {
        "a": _figures(connections=2, messages_in=3),
        "b": _figures(connections=1, messages_in=4),
        "-": _figures(connections=5),
    }
    seen = views(totals, "ops")
    assert set(seen) == {"a", "b", "ops"}
    assert seen["a"].messages_in == 3
    assert (seen["ops"].connections, seen["ops"].messages_in) == (8, 7)
    assert set(views(totals, "")) == {"a", "b"}
