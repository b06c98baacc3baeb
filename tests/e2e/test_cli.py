"""The `starling` admin commands against the shared mesh, as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho


def starling(mesh: MeshInfo, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            *args,
            "--data-dir",
            mesh.mesh.data_dir,
            "--token",
            ADMIN_TOKEN,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_admin_commands(mesh: MeshInfo) -> None:
    tenant = f"cli{uuid.uuid4().hex[:6]}"
    out = starling(mesh, "user-add", "--tenant", tenant, "--username", "ops", "--password", "pw")
    assert out.returncode == 0, out.stdout + out.stderr
    c = Paho(mesh.node(0), client_id="cli-client", username=f"{tenant}/ops", password="pw")
    c.connect()
    c.publish("status/cli", "up", 1, retain=True)
    clients = json.loads(starling(mesh, "clients", "--tenant", tenant).stdout)["clients"]
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
