"""Redis Cluster readiness without a cluster: every Lua script of the mesh names each key it
touches in KEYS (nothing built from ARGV or a prefix), and the KEYS its callers pass hash to
one slot for representative arguments (redis-py's `key_slot`). The real cluster runs them in
tests/common/test_redis_cluster_scripts.py."""

from __future__ import annotations

import re

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from services.common import subscription_counts
from services.common.quota_keys import limits_key, scope
from services.metrics import shared as metrics_shared
from services.queue import leases
from services.quota import api as quota_api
from services.router import cluster as router_cluster
from services.session import flapping, liveness, registry
from services.session.registry_keys import claim_keys, release_keys

SCRIPTS = {
    "registry claim": registry._CLAIM,
    "registry release": registry._RELEASE,
    "liveness heard": liveness._HEARD,
    "liveness learn": liveness._LEARN,
    "liveness claim": liveness._CLAIM,
    "liveness done": liveness._DONE,
    "liveness keep": liveness._KEEP,
    "flapping count": flapping._COUNT,
    "quota lease": quota_api._LEASE,
    "quota subscriptions": subscription_counts._HOLD,
    "queue tick": leases._TICK,
    "queue release": leases._RELEASE,
    "router lease": router_cluster._HOLD,
    "metrics swap": metrics_shared._SWAP,
}
KEYLESS = {"TIME"}
_CALL = re.compile(r"redis\.call\('(\w+)'(?:,\s*([^,)]+))?")


def _key_names(script: str) -> set[str]:
    """Names a script may use as a key: KEYS[...], locals bound to one, and the first
    parameter of a local function that every call passes a KEYS[...] to."""
    names = set(re.findall(r"local (\w+) = KEYS\[", script))
    for fn, param in re.findall(r"local function (\w+)\((\w+)", script):
        calls = re.findall(rf"\b{fn}\(([^,)]+)", script.split(f"function {fn}", 1)[1])
        if calls and all(c.startswith("KEYS[") for c in calls):
            names.add(param)
    return names


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_key_a_script_touches_is_named_in_keys(name: str) -> None:
    script = SCRIPTS[name]
    names = _key_names(script)
    for command, first in _CALL.findall(script):
        if command.upper() in KEYLESS:
            continue
        first = first.strip()
        assert first.startswith("KEYS[") or first in names, (
            f"{name}: {command} on {first!r}, not a key named in KEYS"
        )


def _one_slot(keys: list[str]) -> None:
    slots = {key_slot(k.encode()) for k in keys}
    assert len(slots) == 1, f"keys on {len(slots)} slots: {keys}"


@pytest.mark.parametrize("tenant", ["default", "acme", "t-1_x", "a" * 64])
@pytest.mark.parametrize("user", ["", "alice", "{weird}"])
def test_the_keys_of_each_call_share_one_slot(tenant: str, user: str) -> None:
    _one_slot(claim_keys(tenant, "node-1", user))
    _one_slot(release_keys(tenant, "node-1"))
    _one_slot(release_keys(tenant, ""))
    now_s = 1_790_000_000
    for res in ("messages_per_s", "connections"):  # quota lease: limits, counter, nodes
        s = scope(tenant, user)
        _one_slot([limits_key(tenant, user), f"{s}:{res}:{now_s}", f"{s}:{res}:nodes"])
    _one_slot([limits_key(tenant), subscription_counts.subscriptions_key(tenant)])
    address = flapping.address_of("192.0.2.7:1883")
    _one_slot([flapping.count_key(tenant, "client", address), flapping.count_key("", "", address)])


def test_queue_lease_keys_share_one_slot() -> None:
    unconnected = Redis()  # register_script only hashes the script
    table = leases.LeaseTable(unconnected, "i", 64, 1000, "starling:queue:")
    _one_slot(table._keys)
    # `starling:queue:lease:*` still finds them
    assert table._keys[1] == "starling:queue:lease:{q}0"
