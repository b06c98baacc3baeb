"""The deploy files, checked without Docker or a cluster: the compose file parsed (PyYAML)
and held to the settings models (every STARLING_ variable a real setting with a valid value,
every secret declared and written by `starling secrets`, ports and addresses that agree),
and the Kubernetes manifests validated against the Kubernetes JSON schemas
(kubernetes-validate bundles them: offline) and held to the same settings."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from services.cli.main import SERVICES
from services.cli.secrets import NATS_USER_OF, MeshSecrets, write_secret_files
from services.common.config import ENV_PREFIX, ServiceSettings
from services.connection.config import ConnectionSettings
from services.metrics.config import MetricsSettings
from services.queue.config import QueueSettings
from services.quota.config import QuotaSettings
from services.router.config import RouterSettings
from services.rules.config import RulesSettings
from services.session.config import SessionSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s" / "starling.yaml"
SETTINGS: dict[str, type[ServiceSettings]] = {
    "connection": ConnectionSettings,
    "session": SessionSettings,
    "router": RouterSettings,
    "queue": QueueSettings,
    "rules": RulesSettings,
    "quota": QuotaSettings,
    "metrics": MetricsSettings,
}
# Read by the settings loader itself, not fields.
SOURCE_VARIABLES = {"STARLING_SECRETS_DIR", "STARLING_CONFIG"}
# Services that talk to Redis (and so need its password).
REDIS_USERS = {"session", "quota"}
# The services that cannot run several instances yet (issue 18): one each, said in comments.
SINGLE = {"router", "queue", "rules", "quota", "metrics"}
SECRET_TARGET = re.compile(r"^starling_[a-z_]+$")


def _secret_fields(cls: type[ServiceSettings]) -> set[str]:
    return {n for n, f in cls.model_fields.items() if f.annotation is SecretStr}


def _check_env(service: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every STARLING_ variable is a setting of `service`, and the settings load with them."""
    cls = SETTINGS[service]
    fields = set(cls.model_fields)
    for name in env:
        assert name.startswith(ENV_PREFIX), f"{service}: {name} is not a STARLING_ variable"
        if name in SOURCE_VARIABLES:
            continue
        field = name.removeprefix(ENV_PREFIX).lower()
        assert field in fields, f"{service}: {name} is not a setting of {cls.__name__}"
        assert field not in _secret_fields(cls), f"{service}: credential {name} in plain env"
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name not in SOURCE_VARIABLES:
            monkeypatch.setenv(name, str(value))
    # Credentials come from files at run time: stand-ins here so the check can pass.
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", "x")
    monkeypatch.setenv("STARLING_MESH_SECRET", "x")
    settings = cls()  # a bad value raises, naming the setting
    assert settings.metrics_host == "0.0.0.0", f"{service}: metrics not reachable from outside"


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


def test_compose_runs_every_service_and_scales_nodes_and_sessions(
    compose: dict[str, Any],
) -> None:
    runs = _starling_services(compose)
    counts: dict[str, int] = {}
    for service, svc in runs.values():
        counts[service] = counts.get(service, 0) + svc.get("deploy", {}).get("replicas", 1)
    assert set(counts) == set(SERVICES)
    assert counts["connection"] >= 2 and counts["session"] >= 2
    assert all(counts[s] == 1 for s in SINGLE), counts
    header = COMPOSE.read_text().split("x-starling:")[0]  # the file says what cannot scale
    assert "ONE instance" in header and all(s in header for s in SINGLE)


def test_compose_nats_is_a_cluster_of_three_with_jetstream(compose: dict[str, Any]) -> None:
    nats = {n: s for n, s in compose["services"].items() if s.get("image", "").startswith("nats")}
    assert len(nats) == 3
    names = set()
    for svc in nats.values():
        args = " ".join(svc["command"])
        assert "--cluster_name=starling" in args and "--routes=" in args
        names.add(re.search(r"--name=(\S+)", args).group(1))  # type: ignore[union-attr]
        routes = re.search(r"--routes=(\S+)", args).group(1)  # type: ignore[union-attr]
        assert {r.split("//")[1].split(":")[0] for r in routes.split(",")} == set(nats)
        assert "nats.conf" in svc["secrets"]
    assert names == set(nats)
    url = compose["x-starling"]["environment"]["STARLING_NATS_URL"]
    assert {u.split("//")[1].split(":")[0] for u in url.split(",")} == set(nats)
    # JetStream on, and on disk before it acknowledges (the nats.conf `starling secrets` writes).
    assert {"redis", "cassandra"} <= set(compose["services"])


def test_compose_env_is_real_settings_with_valid_values(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, (service, svc) in _starling_services(compose).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        _check_env(service, env, monkeypatch)
        expected_user = NATS_USER_OF.get(service, "")
        assert env.get("STARLING_NATS_USER", "") == expected_user, name


def test_compose_addresses_and_ports_agree_with_the_settings(compose: dict[str, Any]) -> None:
    runs = _starling_services(compose)
    by_service = {service: name for name, (service, _) in runs.items()}
    env = compose["x-starling"]["environment"]
    for service in ("session", "router", "queue", "quota", "metrics"):
        host, port = env[f"STARLING_{service.upper()}_ADDR"].split(":")
        assert host == by_service[service], f"{service} address names no compose service"
        assert int(port) == SETTINGS[service].model_fields["grpc_port"].default
    published: list[str] = []
    node_ids = set()
    for name, (service, svc) in runs.items():
        if service != "connection":
            assert "ports" not in svc, f"{name}: only nodes publish ports"
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
    assert len(node_ids) == len([s for s, _ in runs.values() if s == "connection"])


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
            assert field in _secret_fields(SETTINGS[service]), f"{name}: {target} is no setting"
            targets[field] = source
        need = {"admin_token", "mesh_secret"}
        if service in REDIS_USERS:
            need.add("redis_password")
        user = NATS_USER_OF.get(service)
        if user:
            need.add("nats_password")
            assert targets["nats_password"] == f"starling_nats_{user}_password", name
        assert need <= set(targets), f"{name} lacks {need - set(targets)}"


# ---- Kubernetes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(K8S.read_text()) if d]
    assert docs
    return docs


def test_k8s_manifests_validate_against_the_kubernetes_schemas(
    manifests: list[dict[str, Any]],
) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    version = kv.latest_version()
    for doc in manifests:
        kv.validate(doc, version, strict=True)  # raises naming the bad field


def test_the_schema_check_catches_a_broken_manifest(manifests: list[dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    [nodes] = [d for d in manifests if d["kind"] == "StatefulSet"]
    broken = yaml.safe_load(yaml.safe_dump(nodes))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "x"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)
    typo = yaml.safe_load(yaml.safe_dump(nodes))
    typo["spec"]["replica"] = 3
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, kv.latest_version(), strict=True)


def _workloads(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["spec"]["template"]["spec"]["containers"][0]["args"][1]: d
        for d in manifests
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def test_k8s_every_service_has_probes_resources_service_and_budget(
    manifests: list[dict[str, Any]],
) -> None:
    work = _workloads(manifests)
    assert set(work) == set(SERVICES)
    assert work["connection"]["kind"] == "StatefulSet"
    budgets = {
        d["spec"]["selector"]["matchLabels"]["app"]
        for d in manifests
        if d["kind"] == "PodDisruptionBudget"
    }
    services = [d for d in manifests if d["kind"] == "Service"]
    for service, d in work.items():
        app = d["spec"]["selector"]["matchLabels"]["app"]
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        grpc_port = SETTINGS[service].model_fields["grpc_port"].default
        assert c["readinessProbe"]["grpc"]["port"] == grpc_port, service
        assert c["livenessProbe"]["grpc"] == {"port": grpc_port, "service": "liveness"}
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == grpc_port and ports["metrics"] == 9100
        assert app in budgets, f"{service}: no PodDisruptionBudget"
        assert any(s["spec"]["selector"]["app"] == app for s in services), service
        replicas = d["spec"]["replicas"]
        assert replicas == 1 if service in SINGLE else replicas >= 2, (service, replicas)


def test_k8s_env_is_real_settings_and_credentials_come_from_the_secret(
    manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    maps = {d["metadata"]["name"]: d["data"] for d in manifests if d["kind"] == "ConfigMap"}
    written = {p.name for p in write_secret_files(tmp_path, MeshSecrets())}
    for service, d in _workloads(manifests).items():
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        env: dict[str, str] = {}
        for source in c["envFrom"]:
            env.update(maps[source["configMapRef"]["name"]])
        for e in c["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "starling" and ref["key"] in written, (service, ref)
                assert e["name"] == "STARLING_NATS_PASSWORD", (service, e["name"])
                assert ref["key"] == f"starling_nats_{NATS_USER_OF[service]}_password"
            else:
                env[e["name"]] = "pod-name"
        _check_env(service, env, monkeypatch)
        assert env.get("STARLING_NATS_USER", "") == NATS_USER_OF.get(service, ""), service
        [vol] = pod["volumes"]
        keys = {i["key"] for i in vol["secret"]["items"]}
        assert vol["secret"]["secretName"] == "starling" and keys <= written
        need = {"starling_admin_token", "starling_mesh_secret"}
        if service in REDIS_USERS:
            need.add("starling_redis_password")
        assert need <= keys, (service, need - keys)
        for k in keys:
            assert k.removeprefix("starling_") in _secret_fields(SETTINGS[service])


def test_k8s_nodes_drain_before_they_stop(manifests: list[dict[str, Any]]) -> None:
    node = _workloads(manifests)["connection"]
    [config] = [
        d
        for d in manifests
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "starling-connection"
    ]
    pod = node["spec"]["template"]["spec"]
    hook = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "starling drain" in hook and "--wait" in hook and "127.0.0.1:7010" in hook
    timeout = float(config["data"]["STARLING_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > timeout + ConnectionSettings().shutdown_grace_s
    [budget] = [
        d
        for d in manifests
        if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "starling-connection"
    ]
    assert budget["spec"]["maxUnavailable"] == 1
