"""The Kubernetes manifests, checked without a cluster: validated against the Kubernetes JSON
schemas (kubernetes-validate bundles them: offline) and held to the settings models, as the
compose file is (test_deploy_files.py)."""

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
    GRPC_PORTS,
    K8S,
    K8S_JOBS,
    REDIS_USERS,
    SCALED,
    SETTINGS,
    SHARING,
    SINGLE,
    check_env,
    nats_conf_routes,
    secret_fields,
)

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
    jobs = [d for d in yaml.safe_load_all(K8S_JOBS.read_text()) if d]
    for doc in manifests + jobs:
        kv.validate(doc, version, strict=True)  # raises naming the bad field
    for job in jobs:  # the image's entrypoint is `starling`: args are its subcommand
        [c] = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        assert c["args"][0] == "analytics", c["args"]


def test_the_schema_check_catches_a_broken_manifest(manifests: list[dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    nodes = _workloads(manifests)["connection"]
    broken = yaml.safe_load(yaml.safe_dump(nodes))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "x"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)
    typo = yaml.safe_load(yaml.safe_dump(nodes))
    typo["spec"]["replica"] = 3
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, kv.latest_version(), strict=True)


def _workloads(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Starling service -> its Deployment or StatefulSet."""
    return {
        d["spec"]["template"]["spec"]["containers"][0]["args"][1]: d
        for d in manifests
        if d["kind"] in ("Deployment", "StatefulSet")
        and d["spec"]["template"]["spec"]["containers"][0]["image"].startswith("starling")
    }


def _config(manifests: list[dict[str, Any]], name: str) -> dict[str, str]:
    [data] = [
        d["data"] for d in manifests if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name
    ]
    return data


def _pod_env(manifests: list[dict[str, Any]], service: str) -> dict[str, str]:
    """The container's environment as the pod sees it (secrets left out: checked apart;
    a pod's name and ordinal as stand-ins)."""
    [c] = _workloads(manifests)[service]["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in c["envFrom"]:
        env.update(_config(manifests, source["configMapRef"]["name"]))
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = "0" if "pod-index" in path else "pod-name"
    return env


def test_k8s_every_service_has_probes_resources_service_and_budget(
    manifests: list[dict[str, Any]],
) -> None:
    work = _workloads(manifests)
    assert set(work) == set(SERVICES)
    assert work["connection"]["kind"] == "StatefulSet"
    budgets = {
        d["spec"]["selector"]["matchLabels"]["app"]: d["spec"]
        for d in manifests
        if d["kind"] == "PodDisruptionBudget"
    }
    services = [d for d in manifests if d["kind"] == "Service"]
    for service, d in work.items():
        app = d["spec"]["selector"]["matchLabels"]["app"]
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        grpc_port = GRPC_PORTS[service]
        assert c["readinessProbe"]["grpc"]["port"] == grpc_port, service
        assert c["livenessProbe"]["grpc"] == {"port": grpc_port, "service": "liveness"}
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == grpc_port and ports["metrics"] == 9100
        assert budgets[app] == {"maxUnavailable": 1, "selector": {"matchLabels": {"app": app}}}
        assert any(s["spec"]["selector"]["app"] == app for s in services), service
        replicas = d["spec"]["replicas"]
        assert replicas == 1 if service in SINGLE else replicas >= SCALED, (service, replicas)


def test_k8s_several_instances_are_addressed_as_several(manifests: list[dict[str, Any]]) -> None:
    """As in compose: dns:///NAME for a service of several pods, NAME a headless Service
    selecting them all (its DNS name lists every ready pod; a ClusterIP would pin each
    caller's connection to one pod); a single pod's service by its own name."""
    env = _config(manifests, "starling")
    work = _workloads(manifests)
    services = {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Service"}
    for service in ("session", "router", "queue", "quota", "metrics"):
        address = env[f"STARLING_{service.upper()}_ADDR"]
        name, several = target(address)
        host, port = name.removeprefix("dns:///").rsplit(":", 1)
        assert int(port) == GRPC_PORTS[service], address
        replicas = work[service]["spec"]["replicas"]
        assert several == (replicas > 1), address
        svc = services[host]["spec"]
        assert svc["selector"]["app"] == work[service]["spec"]["selector"]["matchLabels"]["app"]
        assert (svc.get("clusterIP") == "None") == several, f"{host}: headless iff several"


def test_k8s_queue_instances_know_their_ordinal_and_count(manifests: list[dict[str, Any]]) -> None:
    queue = _workloads(manifests)["queue"]
    assert queue["kind"] == "StatefulSet", "each queue instance needs a stable ordinal"
    [c] = queue["spec"]["template"]["spec"]["containers"]
    refs = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}) for e in c["env"]}
    assert refs["STARLING_INSTANCE_INDEX"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    env = _pod_env(manifests, "queue")
    assert int(env["STARLING_INSTANCE_COUNT"]) == queue["spec"]["replicas"]
    for service in SHARING:
        env = _pod_env(manifests, service)
        replicas = _workloads(manifests)[service]["spec"]["replicas"]
        assert int(env.get("STARLING_INSTANCE_COUNT", 1)) == replicas, service
    metrics = _workloads(manifests)["metrics"]
    assert metrics["kind"] == "StatefulSet", "metrics instance 0 publishes $SYS: ordinals"


def test_k8s_nats_is_a_cluster_of_three_with_locked_routes(
    manifests: list[dict[str, Any]], tmp_path: Path
) -> None:
    [nats] = [
        d for d in manifests if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "nats"
    ]
    assert nats["spec"]["replicas"] == 3
    pods = [f"nats-{i}.{nats['spec']['serviceName']}" for i in range(3)]
    [svc] = [d for d in manifests if d["kind"] == "Service" and d["metadata"]["name"] == "nats"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    pod = nats["spec"]["template"]["spec"]
    [vol] = [v for v in pod["volumes"] if "secret" in v]
    assert vol["secret"]["secretName"] == "starling"
    assert vol["secret"]["items"] == [{"key": "nats.conf", "path": "nats.conf"}]
    [c] = pod["containers"]
    assert "--name=$(POD_NAME)" in c["args"] and "/etc/nats/nats.conf" in c["args"]
    assert {p["containerPort"] for p in c["ports"]} == {4222, 6222, 8222}
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    budget = [
        d
        for d in manifests
        if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == "nats"
    ]
    assert budget and budget[0]["spec"]["maxUnavailable"] == 1
    # The clients name every server; the Secret's nats.conf, made as the header says, routes
    # among the same three with the route password.
    url = _config(manifests, "starling")["STARLING_NATS_URL"]
    assert [u.split("//")[1].rsplit(":", 1)[0] for u in url.split(",")] == pods
    made_with = re.search(r"starling secrets --out \S+ --nats-servers (\S+)", K8S.read_text())
    assert made_with and made_with.group(1).split(",") == pods
    write_secret_files(tmp_path, MeshSecrets(), nats_servers=pods)
    password, routes = nats_conf_routes((tmp_path / "nats.conf").read_text())
    assert routes == [(password, p) for p in pods]


def test_k8s_env_is_real_settings_and_credentials_come_from_the_secret(
    manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    written = {p.name for p in write_secret_files(tmp_path, MeshSecrets())}
    for service, d in _workloads(manifests).items():
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        for e in c["env"]:
            if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "starling" and ref["key"] in written, (service, ref)
                assert e["name"] == "STARLING_NATS_PASSWORD", (service, e["name"])
                assert ref["key"] == f"starling_nats_{NATS_USER_OF[service]}_password"
        env = _pod_env(manifests, service)
        check_env(service, env, monkeypatch)
        assert env.get("STARLING_NATS_USER", "") == NATS_USER_OF.get(service, ""), service
        [vol] = pod["volumes"]
        keys = {i["key"] for i in vol["secret"]["items"]}
        assert vol["secret"]["secretName"] == "starling" and keys <= written
        need = {"starling_admin_token", "starling_mesh_secret"}
        if service in REDIS_USERS or int(env.get("STARLING_INSTANCE_COUNT", 1)) > 1:
            need.add("starling_redis_password")
        assert need <= keys, (service, need - keys)
        for k in keys:
            assert k.removeprefix("starling_") in secret_fields(SETTINGS[service])


def test_k8s_nodes_drain_before_they_stop(manifests: list[dict[str, Any]]) -> None:
    node = _workloads(manifests)["connection"]
    config = _config(manifests, "starling-connection")
    pod = node["spec"]["template"]["spec"]
    hook = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "starling drain" in hook and "--wait" in hook and "127.0.0.1:7010" in hook
    timeout = float(config["STARLING_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > timeout + ConnectionSettings().shutdown_grace_s
