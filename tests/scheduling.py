"""How `make test` spreads the suite over parallel workers (pytest-xdist, `--dist loadfile
--no-loadscope-reorder`).

Each test file is one unit of work, run whole by one worker (its module fixtures, such as a
mesh of its own, start once); the fault suite's files too (each worker that runs one starts
the package's `fault_mesh` once). The partition suite's files are one unit together: their
package fixture builds the multi-host mesh in network namespaces with fixed names, which two
workers cannot both hold (`UnitScheduling`, used by `--dist loadfile` through
tests/conftest.py). Units are handed out longest first, so the long files
(measured seconds below, from `pytest --durations=0` on this 2-core machine) do not end up
last on a worker while the others idle: a file missing from the table counts as short and
keeps its collection order. Refresh the table when a file's time changes a lot.

Marks decide nothing here: every test runs, in whichever worker gets its file
(docs/testing.md says when workers help).
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

# Seconds per file in a 2-worker run (rounded); only the long ones matter.
SECONDS = {
    "tests/partitions": 150,  # one unit (TOGETHER)
    "tests/simulation/test_sim_queue.py": 90,
    "tests/faults/test_rolling.py": 52,
    "tests/faults/test_under_load.py": 44,
    "tests/cli/test_analytics_cli.py": 30,
    "tests/e2e/test_drain.py": 40,
    "tests/faults/test_kills.py": 39,
    "tests/faults/test_scaled.py": 38,
    "tests/security/test_auth_cost.py": 35,
    "tests/analytics/test_queue_compaction.py": 25,
    "tests/analytics/test_compaction_mesh.py": 33,
    "tests/rules/test_cli.py": 8,
    "tests/e2e/test_reconnect_storm.py": 30,
    "tests/simulation/test_sim_sessions.py": 29,
    "tests/e2e/test_launcher.py": 26,
    "tests/security/test_attacks_codec.py": 26,
    "tests/session/test_liveness_shared.py": 25,
    "tests/console/test_console_operations.py": 24,
    "tests/e2e/test_cli.py": 10,
    "tests/queue/test_redis_queue_kill.py": 23,
    "tests/shared_groups/test_group_queue_kill.py": 30,
    "tests/shared_groups/test_durable_groups.py": 12,
    "tests/gateway/test_gateway_kill.py": 15,
    "tests/gateway/test_coap.py": 15,
    "tests/gateway/test_http_publish.py": 15,
    "tests/test_compiled_core.py": 12,
    "tests/faults/test_redis_cluster.py": 22,
    "tests/e2e/test_profiles.py": 21,
    "tests/faults/test_queue_instances.py": 21,
    "tests/connection/test_lease.py": 21,
    "tests/e2e/test_retained_delayed.py": 20,
    "tests/analytics/test_job_columns.py": 20,
    "tests/console/test_console_operator.py": 20,
    "tests/faults/test_sentinel.py": 19,
    "tests/rules/test_e2e.py": 18,
    "tests/e2e/test_pubsub.py": 17,
    "tests/test_suite_plumbing.py": 30,
    "tests/quota/test_quota_mesh.py": 16,
    "tests/analytics/test_tenant_report.py": 16,
    "tests/security/test_tenant_limits.py": 15,
    "tests/session/test_failover.py": 15,
    "tests/common/test_codec_properties.py": 15,
    "tests/faults/test_kill_wills.py": 14,
    "tests/rules/test_autosub_connack.py": 13,
    "tests/faults/test_mesh_restart.py": 13,
    "tests/analytics/test_routes_snapshot.py": 13,
}


# Folders whose files run together, on one worker.
TOGETHER = ("tests/partitions",)


def unit_of_id(nodeid: str) -> str:
    """The unit of work a test id belongs to: its file, or its folder when that is TOGETHER."""
    file = nodeid.split("::", 1)[0]
    return next((f for f in TOGETHER if file.startswith(f + "/")), file)


def unit_of(item: pytest.Item) -> str:
    """The unit of work an item belongs to."""
    return unit_of_id(item.nodeid)


class UnitScheduling(LoadFileScheduling):
    """`--dist loadfile` with the TOGETHER folders as one unit each."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of_id(nodeid)


def longest_first(items: list[pytest.Item]) -> None:
    """Order the files longest first (stable: the tests of a file, and the short files, keep
    their order)."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(unit_of(item), i)
    items.sort(key=lambda it: (-SECONDS.get(unit_of(it), 0), first_seen[unit_of(it)]))
