"""A local Sentinel-managed Redis for `starling up --redis sentinel` and for tests: one
primary, two replicas and three Sentinels (quorum 2) on 127.0.0.1, made of the Debian
`redis-server` binary (`redis-server <conf> --sentinel`, so no `redis-sentinel` is needed).

Owns the config text of each process (`server_conf`, `sentinel_conf`), the settings that
point the services at the Sentinels (`sentinel_env`) and the readiness check
(`sentinel_ready`: every Sentinel knows the primary, both replicas and the other Sentinels,
so that a failover can be agreed on). services/cli/redis_setup.py spawns the processes.

Every process requires the mesh's Redis password (servers `requirepass`/`masterauth`,
Sentinels `requirepass`, `auth-pass` towards the servers, `sentinel-pass` towards each
other), written to 0600 files (a Sentinel rewrites its own). Nothing is kept on disk, as for
the standalone local Redis: Starling keeps in Redis only what it may lose. A primary is
declared down after DOWN_AFTER_MS without an answer; a replica is then promoted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MASTER_NAME = "starling"
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 10_000
QUORUM = 2


@dataclass(frozen=True, slots=True)
class SentinelPorts:
    """Where the processes of a local Sentinel setup listen."""

    primary: int
    replicas: tuple[int, ...]
    sentinels: tuple[int, ...]


def server_conf(*, port: int, folder: str, password: str, primary: int = 0) -> str:
    """A data server's config; `primary`: the port it replicates (0: it is the primary). Each
    has `masterauth`: any of them may be a replica after a failover."""
    text = (
        f'port {port}\nbind 127.0.0.1\ndir {folder}\nsave ""\nappendonly no\n'
        f"daemonize no\nrequirepass {password}\nmasterauth {password}\n"
    )
    if primary:
        text += f"replicaof 127.0.0.1 {primary}\n"
    return text


def sentinel_conf(
    *,
    port: int,
    folder: str,
    password: str,
    primary: int,
    master_name: str = MASTER_NAME,
    quorum: int = QUORUM,
    down_after_ms: int = DOWN_AFTER_MS,
    failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
) -> str:
    """A Sentinel's config (the Sentinel rewrites it as it learns the setup)."""
    m = master_name
    return (
        f"port {port}\nbind 127.0.0.1\ndir {folder}\ndaemonize no\n"
        f"requirepass {password}\nsentinel sentinel-pass {password}\n"
        f"sentinel monitor {m} 127.0.0.1 {primary} {quorum}\n"
        f"sentinel auth-pass {m} {password}\n"
        f"sentinel down-after-milliseconds {m} {down_after_ms}\n"
        f"sentinel failover-timeout {m} {failover_timeout_ms}\n"
        f"sentinel parallel-syncs {m} 1\n"
    )


def sentinel_env(ports: SentinelPorts, master_name: str = MASTER_NAME) -> dict[str, str]:
    """The services' settings for the setup (the password is the mesh's Redis password,
    which the launcher gives them as STARLING_REDIS_PASSWORD; the Sentinels require the
    same one)."""
    return {
        "STARLING_REDIS_MODE": "sentinel",
        "STARLING_REDIS_SENTINELS": json.dumps([f"127.0.0.1:{p}" for p in ports.sentinels]),
        "STARLING_REDIS_MASTER_NAME": master_name,
    }


def master_state(port: int, password: str, master_name: str = MASTER_NAME) -> dict[str, object]:
    """What the Sentinel on `port` says of the primary ({} when it cannot say)."""
    # Here, not at the top: every `starling` command imports this module (for `--redis`).
    from redis import Redis
    from redis.exceptions import RedisError

    try:
        with Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1) as s:
            state = s.sentinel_master(master_name)
    except RedisError:
        return {}
    return dict(state) if isinstance(state, dict) else {}


def primary_port(ports: SentinelPorts, password: str, master_name: str = MASTER_NAME) -> int:
    """The port of the primary as the first Sentinel that answers names it (0: none)."""
    for port in ports.sentinels:
        state = master_state(port, password, master_name)
        if state.get("port"):
            return int(str(state["port"]))
    return 0


def sentinel_ready(ports: SentinelPorts, password: str, master_name: str = MASTER_NAME) -> bool:
    """Every Sentinel sees a primary that is up, every replica and the other Sentinels."""
    for port in ports.sentinels:
        state = master_state(port, password, master_name)
        if not state or state.get("is_sdown") or state.get("is_odown"):
            return False
        if int(str(state.get("num-slaves", 0))) < len(ports.replicas):
            return False
        if int(str(state.get("num-other-sentinels", 0))) < len(ports.sentinels) - 1:
            return False
    return True
