"""`starling secrets --out DIR`: the files deploy/ mounts, in a private folder, with a
nats.conf that nats-server accepts and that locks every user to its subjects."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from services.cli.launcher import nats_binary
from services.cli.main import main


def test_secret_files_for_compose_and_kubernetes(tmp_path: Path) -> None:
    out = tmp_path / "secrets"
    assert main(["secrets", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {
        "starling_admin_token",
        "starling_mesh_secret",
        "starling_redis_password",
        "starling_nats_route_password",
        *(f"starling_nats_{u}_password" for u in ("connection", "session", "router", "queue")),
        *(f"starling_nats_{u}_password" for u in ("rules", "quota", "metrics", "operator")),
        "nats.conf",
    }
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    token = (out / "starling_admin_token").read_text().strip()
    assert len(token) == 64 and token != (out / "starling_mesh_secret").read_text().strip()
    conf = (out / "nats.conf").read_text()
    assert (out / "starling_nats_queue_password").read_text().strip() in conf
    check = subprocess.run(
        [nats_binary(), "-c", str(out / "nats.conf"), "-t"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # A second run makes a different set (rotation), never reuses the first.
    again = tmp_path / "again"
    main(["secrets", "--out", str(again)])
    assert (again / "starling_admin_token").read_text().strip() != token


def test_nats_conf_locks_the_cluster_routes(tmp_path: Path) -> None:
    """The default file is the compose file's cluster: routes to its three servers, each
    with the route password, and a cluster port that asks for it. One server: no cluster."""
    out = tmp_path / "secrets"
    assert main(["secrets", "--out", str(out)]) == 0
    conf = (out / "nats.conf").read_text()
    password = (out / "starling_nats_route_password").read_text().strip()
    assert len(password) == 64
    routes = re.search(r"routes: \[(.*)\]", conf)
    assert routes is not None, conf
    assert re.findall(r'"nats-route://route:([0-9a-f]+)@(nats-\d):6222"', routes.group(1)) == [
        (password, "nats-1"),
        (password, "nats-2"),
        (password, "nats-3"),
    ]
    assert f'authorization {{ user: "route", password: "{password}" }}' in conf
    assert 'listen: "0.0.0.0:6222"' in conf

    k8s = tmp_path / "k8s"
    servers = "nats-0.nats,nats-1.nats,nats-2.nats:7222"
    assert main(["secrets", "--out", str(k8s), "--nats-servers", servers]) == 0
    conf = (k8s / "nats.conf").read_text()
    assert "@nats-0.nats:6222" in conf and "@nats-2.nats:7222" in conf
    check = subprocess.run(
        [nats_binary(), "-c", str(k8s / "nats.conf"), "-t"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

    single = tmp_path / "single"
    assert main(["secrets", "--out", str(single), "--nats-servers", ""]) == 0
    assert "cluster" not in (single / "nats.conf").read_text()
