"""`starling secrets --out DIR`: the files deploy/ mounts, in a private folder, with a
nats.conf that nats-server accepts and that locks every user to its subjects."""

from __future__ import annotations

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
