"""The `starling` admin commands against the shared mesh, as an operator runs them: the token
comes from the file `starling up` wrote under the data dir. The commands run in this process
(tests/cli/in_process.py) but for a few that check the entry point in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

from tests.cli import in_process
from tests.cli.in_process import starling_in_process
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.poll import wait_until

NO_TOKEN_ENV: dict[str, str | None] = {"STARLING_ADMIN_TOKEN": None}


def starling(mesh: MeshInfo, *args: str) -> subprocess.CompletedProcess[str]:
    """`starling ARGS --data-dir <the mesh's>` run in this process (tests/cli/in_process.py),
    without STARLING_ADMIN_TOKEN: the token comes from the data dir's file."""
    return starling_in_process(*args, "--data-dir", mesh.mesh.data_dir, env=NO_TOKEN_ENV)


def starling_process(mesh: MeshInfo, *args: str) -> subprocess.CompletedProcess[str]:
    """The same in a process of its own: the installed entry point."""
    return in_process.starling_process(*args, "--data-dir", mesh.mesh.data_dir, env=NO_TOKEN_ENV)


def test_admin_commands(mesh: MeshInfo) -> None:
    tenant = f"cli{uuid.uuid4().hex[:6]}"
    out = starling(mesh, "user-add", "--tenant", tenant, "--username", "ops", "--password", "pw")
    assert out.returncode == 0, out.stdout + out.stderr
    c = Paho(mesh.node(0), client_id="cli-client", username=f"{tenant}/ops", password="pw")
    c.connect()
    c.publish("status/cli", "up", 1, retain=True)
    # A process of its own: the admin commands' run through the installed entry point.
    listed = starling_process(mesh, "clients", "--tenant", tenant)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    clients = json.loads(listed.stdout)["clients"]
    assert [(x["client_id"], x["node_id"]) for x in clients] == [("cli-client", "connection-0")]
    retained = json.loads(
        starling(mesh, "retained", "--tenant", tenant, "--filter", "status/#").stdout
    )
    assert [m["topic"] for m in retained["messages"]] == ["status/cli"]
    bad = starling(mesh, "acl-get", "--tenant", "no such tenant")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stdout
    c.close()


def test_routes_show_transient_nodes_and_persistent_sessions(mesh: MeshInfo) -> None:
    a = Paho(mesh.node(0))
    a.connect()
    a.subscribe("fleet/+/gps", 1)
    b = Paho(mesh.node(1))
    b.connect()
    b.subscribe("fleet/+/gps", 0)
    durable = Paho(mesh.node(1), client_id=f"fleet-{uuid.uuid4().hex[:6]}")
    durable.connect(clean_start=False, session_expiry=60)
    durable.subscribe("fleet/#", 1)
    routes = json.loads(starling(mesh, "routes").stdout)["routes"]
    transient = {r["topic_filter"]: r["node_ids"] for r in routes if not r.get("persistent")}
    persistent = {r["topic_filter"]: r["node_ids"] for r in routes if r.get("persistent")}
    assert transient["fleet/+/gps"] == ["connection-0", "connection-1"]
    assert [s.split("#")[0] for s in persistent["fleet/#"]] == [durable.client_id]
    for c in (a, b, durable):
        c.close()


def test_stats_sum_the_reports_of_every_node(mesh: MeshInfo) -> None:
    """Nodes report their counters to the metrics service; `starling stats` sums them."""
    tenant = f"st{uuid.uuid4().hex[:6]}"
    assert (
        starling(
            mesh, "user-add", "--tenant", tenant, "--username", "u", "--password", "pw"
        ).returncode
        == 0
    )
    sub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    sub.connect()
    sub.subscribe("m/#", 1)
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    pub.connect()
    for i in range(5):
        pub.publish(f"m/{i}", "x", 1)
    sub.expect(5)

    def traffic_shown() -> tuple[dict[str, Any], dict[str, Any]] | None:
        stats = json.loads(starling(mesh, "stats").stdout)
        mine = {t["tenant"]: t for t in stats.get("tenants", [])}.get(tenant, {})
        shown = mine.get("messages_in") == 5 and mine.get("messages_out") == 5
        return (stats, mine) if shown else None

    stats, mine = wait_until(traffic_shown, 10, "stats showing the traffic", every_s=0.2)
    assert stats["nodes"] == 2
    assert mine["connections"] == 2
    sub.close()
    pub.close()


def test_a_tenant_name_that_cannot_exist_is_refused_by_every_admin_api(mesh: MeshInfo) -> None:
    # `quota set --tenant 'acme '` used to report success for a tenant it never limits.
    for args in (
        ("quota", "set", "--tenant", "acme ", "--max-connections", "5"),
        ("quota", "get", "--tenant", "bad!"),
        ("retained", "--tenant", "x" * 5000),
        ("acl-get", "--tenant", "a/b"),
    ):
        out = starling(mesh, *args)
        assert out.returncode == 1, (args, out.stdout, out.stderr)
        assert "INVALID_ARGUMENT" in out.stdout and "invalid tenant name" in out.stdout, args


def test_retained_admin_calls_refuse_a_filter_or_topic_that_is_not_one(mesh: MeshInfo) -> None:
    # `a/#/b` used to be matched as `a/#`, `a/+/b` "deleted" nothing.
    tenant = f"cli{uuid.uuid4().hex[:6]}"
    for args in (
        ("retained", "--tenant", tenant, "--filter", "a/#/b"),
        ("retained", "--tenant", tenant, "--filter", "a+/b"),
        ("delete-retained", "--tenant", tenant, "--topic", "a/+/b"),
    ):
        out = starling(mesh, *args)
        assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stdout, (args, out.stdout)
    ok = starling(mesh, "retained", "--tenant", tenant, "--filter", "a/+/b")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_health_of_a_service_the_server_does_not_have_is_not_unreachable(
    mesh: MeshInfo,
) -> None:
    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli.health", mesh.addr("session"), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    assert health().stdout.strip() == "SERVING"
    unknown = health("--service", "no.such.Service")  # the server answered NOT_FOUND
    assert (unknown.returncode, unknown.stdout.strip()) == (1, "SERVICE_UNKNOWN")


def test_a_command_piped_into_a_reader_that_stops_ends_without_a_traceback(
    mesh: MeshInfo,
) -> None:
    cmd = [sys.executable, "-m", "services.cli.main", "status", "--data-dir", mesh.mesh.data_dir]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| head -0`: nobody reads what it prints
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
