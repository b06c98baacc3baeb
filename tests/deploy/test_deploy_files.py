"""The docker compose file, checked without Docker: parsed (PyYAML) and held to the settings
models (every STARLING_ variable a real setting with a valid value, every secret declared and
written by `starling secrets`, ports and addresses that agree, instances that can be several
scaled and addressed as several, a NATS cluster whose routes `starling secrets` locks, health
checks). The Kubernetes manifests: test_deploy_k8s.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli.main import SERVED as SERVICES
from services.cli.secrets import NATS_USER_OF, MeshSecrets, write_secret_files
from services.common.rpc.client import target
from services.connection.config import ConnectionSettings
from tests.deploy.deploy_rules import (
    COMPOSE,
    GRPC_PORTS,
    REDIS_USERS,
    SCALED,
    SECRET_TARGET,
    SETTINGS,
    SHARING,
    SINGLE,
    check_env,
    nats_conf_routes,
    secret_fields,
)

# ---- docker compose ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def _starling_services(compose: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Compose service name -> (Starling service it runs, its definition)."""
    found = {}
    for name, svc in compose["services"].items():
        if svc.get("image") == "starling:latest":
            cmd = svc["command"]
            assert cmd[0] == "serve" and cmd[1] in SERVICES, (name, cmd)
            found[name] = (cmd[1], svc)
    return found


def _instances(compose: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for service, svc in _starling_services(compose).values():
        counts[service] = counts.get(service, 0) + svc.get("deploy", {}).get("replicas", 1)
    return counts


def test_compose_runs_every_service_scaled_where_it_can_be(compose: dict[str, Any]) -> None:
    counts = _instances(compose)
    assert set(counts) == set(SERVICES)
    for service, n in counts.items():
        assert n == 1 if service in SINGLE else n >= SCALED, (service, n)
    header = COMPOSE.read_text().split("x-starling:")[0]  # the file says why ONE
    assert all(f"- {s}: ONE" in header for s in SINGLE), "the header explains each single one"


def test_compose_instances_know_their_ordinal_and_count(compose: dict[str, Any]) -> None:
    """A queue instance needs its own instance_index below instance_count (the route fence
    counts instances by it); a router above one needs instance_count (shared state) and
    Redis."""
    counts = _instances(compose)
    ordinals: dict[str, list[int]] = {}
    for name, (service, svc) in _starling_services(compose).items():
        env = svc["environment"]
        count = int(env.get("STARLING_INSTANCE_COUNT", 1))
        if service in ("queue", "router", "metrics") or "STARLING_INSTANCE_COUNT" in env:
            assert count == counts[service], f"{name}: instance_count {count}"
        if "STARLING_INSTANCE_INDEX" in env:
            assert "replicas" not in svc.get("deploy", {}), f"{name}: replicas share one index"
            ordinals.setdefault(service, []).append(int(env["STARLING_INSTANCE_INDEX"]))
    assert sorted(ordinals.get("queue", [])) == list(range(counts["queue"]))
    # Metrics instance 0 alone publishes `$SYS`: each instance its own ordinal too.
    assert sorted(ordinals.get("metrics", [])) == list(range(counts["metrics"]))


def test_compose_several_instances_are_addressed_as_several(compose: dict[str, Any]) -> None:
    """The address of a service with several instances is a dns:/// name that resolves to
    each of them (replicas of one compose service, or an alias they all carry), so callers
    balance and fail over; a single instance is addressed by its own name."""
    env = compose["x-starling"]["environment"]
    runs = _starling_services(compose)
    counts = _instances(compose)
    for service in ("session", "router", "queue", "quota", "metrics"):
        address = env[f"STARLING_{service.upper()}_ADDR"]
        name, several = target(address)
        host, port = name.removeprefix("dns:///").rsplit(":", 1)
        assert int(port) == GRPC_PORTS[service], address
        assert several == (counts[service] > 1), f"{service}: {address}"
        reached = 0
        for cname, (svc_kind, svc) in runs.items():
            aliases = svc.get("networks", {}).get("default", {}).get("aliases", [])
            if host == cname or host in aliases:
                assert svc_kind == service, f"{address} reaches {cname}"
                reached += svc.get("deploy", {}).get("replicas", 1)
        assert reached == counts[service], f"{address} reaches {reached} of {counts[service]}"


def test_compose_every_container_has_a_health_check(compose: dict[str, Any]) -> None:
    runs = _starling_services(compose)
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck")
        assert check and check["test"], f"{name} has no health check"
        if name in runs:
            service = runs[name][0]
            assert check["test"][1:] == [
                "python", "-m", "services.cli.health", f"127.0.0.1:{GRPC_PORTS[service]}"
            ], name  # fmt: skip
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond["condition"] == "service_healthy", f"{name} waits for {dep} started"
            assert "healthcheck" in compose["services"][dep], (name, dep)


def test_compose_nats_is_a_cluster_of_three_with_locked_routes(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    nats = {n: s for n, s in compose["services"].items() if s.get("image", "").startswith("nats")}
    assert len(nats) == 3
    names = set()
    for svc in nats.values():
        args = " ".join(svc["command"])
        assert "-c /run/secrets/nats.conf" in args and "nats.conf" in svc["secrets"]
        names.add(re.search(r"--name=(\S+)", args).group(1))  # type: ignore[union-attr]
        assert "--routes" not in args, "routes come from nats.conf, with the route password"
    assert names == set(nats)
    url = compose["x-starling"]["environment"]["STARLING_NATS_URL"]
    assert {u.split("//")[1].split(":")[0] for u in url.split(",")} == set(nats)
    # The nats.conf `starling secrets` writes by default: routes to these three servers,
    # each with the password the cluster port asks for; JetStream synced before it acks.
    write_secret_files(tmp_path, MeshSecrets())
    conf = (tmp_path / "nats.conf").read_text()
    password, routes = nats_conf_routes(conf)
    assert sorted(routes) == sorted((password, n) for n in nats)
    assert "sync_interval: always" in conf and 'store_dir: "/data"' in conf
    for svc in nats.values():
        assert any(v.endswith(":/data") for v in svc["volumes"])
    assert compose["x-starling"]["environment"]["STARLING_NATS_STREAM_REPLICAS"] == "3"
    assert {"redis", "cassandra"} <= set(compose["services"])


def test_compose_env_is_real_settings_with_valid_values(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, (service, svc) in _starling_services(compose).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        check_env(service, env, monkeypatch)
        expected_user = NATS_USER_OF.get(service, "")
        assert env.get("STARLING_NATS_USER", "") == expected_user, name


def test_compose_nodes_publish_distinct_ports_and_drain_elsewhere(
    compose: dict[str, Any],
) -> None:
    runs = _starling_services(compose)
    published: list[str] = []
    node_ids = set()
    for name, (service, svc) in runs.items():
        if service == "console":  # its web pages
            assert svc["ports"] == ["8080-8081:8080"], name
            continue
        if service == "gateway":  # HTTP and CoAP, each instance its own host ports
            published += [m.split(":")[0] for m in svc["ports"]]
            node_ids.add(svc["environment"]["STARLING_NODE_ID"])
            continue
        if service != "connection":
            assert "ports" not in svc, f"{name}: only nodes and the console publish ports"
            continue
        node_ids.add(svc["environment"]["STARLING_NODE_ID"])
        assert svc["restart"] == "on-failure", f"{name}: a drained node must stay down"
        ws = int(svc["environment"].get("STARLING_WS_PORT", -1))
        for mapping in svc["ports"]:
            host_port, container_port = mapping.split(":")
            assert int(container_port) in (ConnectionSettings().mqtt_port, ws)
            published.append(host_port)
        refs = svc["environment"]["STARLING_DRAIN_SERVER_REFERENCE"].split()
        own = {f"localhost:{m.split(':')[0]}" for m in svc["ports"]}
        assert refs and not own & set(refs), f"{name} sends its drained clients to itself"
    assert len(published) == len(set(published)), "two nodes publish the same host port"
    peers = [s for s, _ in runs.values() if s in ("connection", "gateway")]
    assert len(node_ids) == len(peers), "a node id twice"


def test_compose_secrets_are_declared_written_and_mounted_where_needed(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    written = {p.name for p in write_secret_files(tmp_path, MeshSecrets())}
    declared = compose["secrets"]
    for key, spec in declared.items():
        assert spec["file"] == f"./secrets/{key}"
        assert key in written, f"secret {key} is not written by `starling secrets`"
    for name, svc in compose["services"].items():
        for ref in svc.get("secrets", []):
            source = ref if isinstance(ref, str) else ref["source"]
            assert source in declared, f"{name} mounts undeclared secret {source}"
    for name, (service, svc) in _starling_services(compose).items():
        targets = {}
        for ref in svc["secrets"]:
            target = ref if isinstance(ref, str) else ref["target"]
            source = ref if isinstance(ref, str) else ref["source"]
            assert SECRET_TARGET.match(target), (name, target)
            field = target.removeprefix("starling_")
            assert field in secret_fields(SETTINGS[service]), f"{name}: {target} is no setting"
            targets[field] = source
        need = {"admin_token", "mesh_secret"}
        if service in REDIS_USERS or (service in SHARING and _instances(compose)[service] > 1):
            need.add("redis_password")
        user = NATS_USER_OF.get(service)
        if user:
            need.add("nats_password")
            assert targets["nats_password"] == f"starling_nats_{user}_password", name
        assert need <= set(targets), f"{name} lacks {need - set(targets)}"
