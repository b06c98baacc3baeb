"""Secrets of a local mesh (`starling up`): generated once per data dir, kept in
`<data-dir>/secrets/` (folder 0700, files 0600) and reused by later runs, so tokens handed to
scripts keep working and the stores stay readable.

- `secrets.json`: the operator admin token, the mesh secret (internal gRPC), the Redis
  password and one NATS password per service user (with `operator`, a full-access user for
  tools and tests).
- `admin-token`: the operator token alone, the file `starling <admin command>` reads by
  default (`--token-file`).

NATS users get the subjects their service uses (`NATS_PERMISSIONS`); metrics does not use
NATS and has no user.

`starling secrets --out DIR` writes a fresh set as one file per secret (for Docker Compose
secrets and `kubectl create secret --from-file`), with a complete nats.conf: JetStream, the
users and, for a NATS cluster, the routes between the servers behind a route password (a
cluster port open to anyone would take any process as a peer server, which then sees every
message).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Per-service NATS permissions. Connection nodes carry MQTT traffic on subjects built from
# topics and groups, so they get everything but the control, queue-notice and JetStream APIs;
# the others get exactly what they publish and subscribe (request replies use _INBOX).
NATS_PERMISSIONS: dict[str, dict[str, dict[str, list[str]]]] = {
    "connection": {
        # svc.router.route, svc.queue.direct and svc.queue.read/ack/released: the persistent
        # path (services/common/bus/unary.py); appends only as checked against the route
        # table's version (svc.queue.direct), never svc.queue.append, which the queue trusts
        # to teach it versions, nor the router's fence and route changes.
        "publish": {
            "allow": [">"],
            "deny": [
                "ctl.>",
                "qn.>",
                "svc.queue.append",
                "svc.queue.append.>",  # an instance's own append subject
                "svc.queue.routes",
                "rt.routes.>",
                "$JS.>",
                "$SYS.>",
            ],
        },
        "subscribe": {"allow": [">"], "deny": ["svc.>", "$JS.>", "$SYS.>"]},
    },
    "session": {
        # ctl.session.changed: a user or ACL changed; every instance drops its copies
        "publish": {
            "allow": [
                "ctl.node.>",
                "ctl.nodes.>",
                "ctl.session.changed",
                "ev.>",
                # wills of connections whose node died, to online subscribers
                # (services/session/wills.py; the router keeps the QoS >= 1 and retained ones)
                "mq.>",
                "mqd.>",
                # ... and those a rule reads, to the RULES stream; the rules' filters asked
                "rl.>",
                "svc.rules.filters",
                "$JS.API.>",
                # Acks of the EVENTS stream's durable consumer that records the event log
                # (services/session/event_recorder.py); denied, every event came back.
                "$JS.ACK.EVENTS.>",
                "_INBOX.>",
            ]
        },
        # svc.session.connect(s)/disconnect: the nodes' CONNECT path (services/common/bus/unary.py)
        "subscribe": {
            "allow": [
                "hb.node.>",
                "hello.node.>",
                "_INBOX.>",
                "svc.session.connect",
                "svc.session.connects",
                "svc.session.disconnect",
                "ctl.session.changed",
                "ctl.quota.bans",
                # the rules' filters of one tenant after a change (the wills' rules feed)
                "ctl.rules.filters",
            ]
        },
    },
    "router": {
        "publish": {
            "allow": [
                "mq.>",
                "mqd.>",
                # delayed messages a rule reads, when due, to the RULES stream; the filters
                "rl.>",
                "svc.rules.filters",
                "ev.>",
                "rt.list",
                "rt.routes.>",
                "svc.queue.append",
                # several router instances append as checked against their table's version
                "svc.queue.direct",
                # the same at the owner of the queue's partition
                "svc.queue.append.>",
                "svc.queue.direct.>",
                "svc.queue.routes",
                "_INBOX.>",
            ]
        },
        # mqf.<router>: fetches of large delayed messages it published by reference;
        # svc.router.route: the nodes' persistent publishes; svc.router.will: their wills
        # settled at CONNECT
        # ctl.queue.owners: which queue instance owns which partition
        "subscribe": {
            "allow": [
                "_INBOX.>",
                "mqf.>",
                "svc.router.route",
                "svc.router.will",
                "ctl.queue.owners",
                # a tenant's limits changed (retained messages and bytes: read again)
                "ctl.quota.limits",
                # the rules' filters of one tenant after a change
                "ctl.rules.filters",
            ]
        },
    },
    "queue": {
        # ctl.queue.owners: the partitions this instance owns (services/queue/ownership.py);
        # ctl.queue.bytes: the bytes its partitions hold per tenant (services/queue/depths.py)
        "publish": {"allow": ["qn.>", "ev.>", "_INBOX.>", "ctl.queue.owners", "ctl.queue.bytes"]},
        # svc.queue.<call> shared by every instance, svc.queue.<call>.<instance> its own;
        # ctl.queue.bytes: the other instances' figures; ctl.quota.limits: a tenant's
        # limits changed (max_queue_depth, max_queued_bytes: its copy is read again)
        "subscribe": {"allow": ["_INBOX.>", "svc.queue.>", "ctl.queue.bytes", "ctl.quota.limits"]},
    },
    # ctl.quota.limits / ctl.quota.bans: limits and the ban list changed (to nodes and
    # session services)
    "quota": {
        "publish": {"allow": ["ctl.quota.>", "_INBOX.>"]},
        "subscribe": {"allow": ["_INBOX.>"]},
    },
    "rules": {
        # mq.>/mqd.>: republished messages to online subscribers; ctl.rules.>/svc.rules.>:
        # rule changes, the nodes' filter requests and metrics among instances.
        "publish": {
            "allow": [
                "$JS.API.>",
                "$JS.ACK.>",
                "_INBOX.>",
                "mq.>",
                "mqd.>",
                "ctl.rules.>",
                "svc.rules.>",
            ]
        },
        "subscribe": {"allow": ["ev.>", "_INBOX.>", "ctl.rules.>", "svc.rules.>"]},
    },
    # mqd.>: `$SYS` topics to their tenants' online subscribers (services/metrics/
    # sys_publisher.py; the router stores the retained copies over gRPC)
    "metrics": {
        "publish": {"allow": ["mqd.>", "_INBOX.>"]},
        "subscribe": {"allow": ["_INBOX.>"]},
    },
    "operator": {},  # no restriction: tools and tests
}
# The NATS user each service process runs as (none: the service does not use NATS).
NATS_USER_OF = {
    "connection": "connection",
    "session": "session",
    "router": "router",
    "queue": "queue",
    "rules": "rules",
    "quota": "quota",
    "metrics": "metrics",
    # The gateway publishes and subscribes on the mesh as a node does: a node's permissions.
    "gateway": "connection",
}


def _random() -> str:
    return secrets.token_hex(32)


@dataclass
class MeshSecrets:
    admin_token: str = field(default_factory=_random)
    mesh_secret: str = field(default_factory=_random)
    redis_password: str = field(default_factory=_random)
    nats: dict[str, str] = field(default_factory=lambda: {u: _random() for u in NATS_PERMISSIONS})
    # The routes between the servers of a local NATS cluster (`starling up --nats 3`): a
    # cluster port without it would take any process as a peer server.
    nats_route_password: str = field(default_factory=_random)

    def values(self) -> list[str]:
        """Every secret, for log greps in tests."""
        return [
            self.admin_token,
            self.mesh_secret,
            self.redis_password,
            self.nats_route_password,
            *self.nats.values(),
        ]


def secrets_dir(data_dir: Path) -> Path:
    return data_dir / "secrets"


def admin_token_file(data_dir: Path) -> Path:
    return secrets_dir(data_dir) / "admin-token"


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by this user only (0600), whatever was there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def load_or_create(data_dir: Path) -> MeshSecrets:
    """The mesh's secrets, generated on first use; users missing from an older file are
    added."""
    folder = secrets_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / "secrets.json"
    try:
        raw = json.loads(path.read_text())
        found = MeshSecrets(**raw)
    except FileNotFoundError:
        found = MeshSecrets()
    for user in NATS_PERMISSIONS:
        found.nats.setdefault(user, _random())
    write_private(path, json.dumps(asdict(found), indent=2))
    return found


def nats_limits() -> str:
    """The size lines of nats.conf: max_payload explicit, from the one constant the mesh
    publisher sizes its messages against (larger ones go by reference,
    services/common/bus/large.py, imported here: it loads the NATS client, which `starling`
    commands that read the admin token need not)."""
    from services.common.bus.large import NATS_MAX_PAYLOAD

    return f"max_payload: {NATS_MAX_PAYLOAD}\nmax_control_line: 64KB\n"


def nats_authorization(s: MeshSecrets) -> str:
    """The `authorization` block of nats.conf: one user per service with its permissions."""
    users = []
    for user, perms in NATS_PERMISSIONS.items():
        entry: dict[str, object] = {"user": user, "password": s.nats[user]}
        if perms:
            entry["permissions"] = perms
        users.append(json.dumps(entry))  # JSON is valid NATS config syntax
    return "authorization {\n  users = [\n    " + ",\n    ".join(users) + "\n  ]\n}\n"


# The user name of the routes between NATS servers (its password: `nats_route_password`).
NATS_ROUTE_USER = "route"
NATS_CLUSTER_NAME = "starling"
NATS_CLUSTER_PORT = 6222
# The servers of deploy/docker-compose.yml's NATS cluster.
COMPOSE_NATS_SERVERS = ("nats-1", "nats-2", "nats-3")


def nats_cluster(password: str, listen: str, peers: list[str]) -> str:
    """The `cluster` block of nats.conf: where this server listens for routes, the route
    user and password it requires, and the routes it opens (`host:port` each) with them.
    The list may name the server itself: nats-server notices and drops a route to itself, so
    every server of a cluster can have the same file."""
    routes = ", ".join(f'"nats-route://{NATS_ROUTE_USER}:{password}@{peer}"' for peer in peers)
    return (
        "cluster {\n"
        f'  name: "{NATS_CLUSTER_NAME}"\n'
        f'  listen: "{listen}"\n'
        f'  authorization {{ user: "{NATS_ROUTE_USER}", password: "{password}" }}\n'
        f"  routes: [{routes}]\n"
        "}\n"
    )


def _peer(server: str) -> str:
    return server if ":" in server else f"{server}:{NATS_CLUSTER_PORT}"


def write_secret_files(
    out: Path,
    s: MeshSecrets,
    nats_listen: str = "0.0.0.0:4222",
    nats_servers: tuple[str, ...] | list[str] = COMPOSE_NATS_SERVERS,
) -> list[Path]:
    """One file per secret under `out`, named as deploy/ expects them, plus a nats.conf
    (JetStream, limits, users and permissions and, with two or more `nats_servers` (host or
    host:port of each server's cluster port, default the compose file's three), the
    password-protected routes among them). Returns the files written.

    The folder is 0700, which keeps other local users out; the files are 0644 because Docker
    Compose bind-mounts each one into a container whose user (uid 10001) is not the owner."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    files = {
        "starling_admin_token": s.admin_token,
        "starling_mesh_secret": s.mesh_secret,
        "starling_redis_password": s.redis_password,
        **{f"starling_nats_{user}_password": pw for user, pw in s.nats.items()},
        # In nats.conf too; alone for a NATS run by other means (its Helm chart, say).
        "starling_nats_route_password": s.nats_route_password,
        "nats.conf": f'listen: "{nats_listen}"\n'
        # Every write on disk before JetStream acknowledges it (by default it syncs every
        # two minutes: a power cut loses what was acknowledged since).
        + 'jetstream { store_dir: "/data", sync_interval: always }\n'
        + (
            nats_cluster(
                s.nats_route_password,
                f"0.0.0.0:{NATS_CLUSTER_PORT}",
                [_peer(n) for n in nats_servers],
            )
            if len(nats_servers) > 1
            else ""
        )
        + nats_limits()
        + nats_authorization(s),
    }
    written = []
    for name, text in files.items():
        path = out / name
        write_private(path, text if name.endswith(".conf") else text + "\n")
        path.chmod(0o644)
        written.append(path)
    return written
