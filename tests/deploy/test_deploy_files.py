"""The deploy files, checked without Docker or a cluster: the compose file parsed (PyYAML)
and held to the settings models (every STARLING_ variable a real setting with a valid value,
every secret declared and written by `starling secrets`, ports and addresses that agree,
instances that can be several scaled and addressed as several, a NATS cluster whose routes
`starling secrets` locks, health checks), and the Kubernetes manifests validated against
the Kubernetes JSON schemas (kubernetes-validate bundles them: offline) and held to the
same settings."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from services.cli.main import SERVED as SERVICES
from services.cli.secrets import NATS_USER_OF, MeshSecrets, write_secret_files
from services.common.config import ENV_PREFIX, ServiceSettings
from services.common.rpc.client import target
from services.connection.config import ConnectionSettings
from services.console.config import ConsoleSettings
from services.metrics.config import MetricsSettings
from services.queue.config import QueueSettings
from services.quota.config import QuotaSettings
from services.router.config import RouterSettings
from services.rules.config import RulesSettings
from services.session.config import SessionSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s" / "starling.yaml"
K8S_JOBS = ROOT / "deploy" / "k8s" / "analytics-cronjob.yaml"
SETTINGS: dict[str, type[ServiceSettings]] = {
    "connection": ConnectionSettings,
    "session": SessionSettings,
    "router": RouterSettings,
    "queue": QueueSettings,
    "rules": RulesSettings,
    "quota": QuotaSettings,
    "metrics": MetricsSettings,
    "console": ConsoleSettings,
}
# Read by the settings loader itself, not fields.
SOURCE_VARIABLES = {"STARLING_SECRETS_DIR", "STARLING_CONFIG"}
# Services that talk to Redis (and so need its password); a router and the metrics service
# only among several (their shared state).
REDIS_USERS = {"session", "quota", "queue", "console"}
SHARING = {"router", "metrics"}
# One instance each, the reason said in the files' headers (none left: issue 18).
SINGLE: set[str] = set()
# Everything else runs at least this many.
SCALED = 2
GRPC_PORTS = {name: cls.model_fields["grpc_port"].default for name, cls in SETTINGS.items()}
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


def _nats_conf_routes(conf: str) -> tuple[str, list[tuple[str, str]]]:
    """The route password the cluster port asks for, and (password, host) of each route."""
    asked = re.search(r'authorization \{ user: "route", password: "([0-9a-f]+)" \}', conf)
    assert asked, "the cluster port asks for no password"
    routes = re.findall(r'"nats-route://route:([0-9a-f]+)@([^:"]+):6222"', conf)
    return asked.group(1), routes


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
    password, routes = _nats_conf_routes(conf)
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
        _check_env(service, env, monkeypatch)
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
        if service in REDIS_USERS or (service in SHARING and _instances(compose)[service] > 1):
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
    password, routes = _nats_conf_routes((tmp_path / "nats.conf").read_text())
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
        _check_env(service, env, monkeypatch)
        assert env.get("STARLING_NATS_USER", "") == NATS_USER_OF.get(service, ""), service
        [vol] = pod["volumes"]
        keys = {i["key"] for i in vol["secret"]["items"]}
        assert vol["secret"]["secretName"] == "starling" and keys <= written
        need = {"starling_admin_token", "starling_mesh_secret"}
        if service in REDIS_USERS or int(env.get("STARLING_INSTANCE_COUNT", 1)) > 1:
            need.add("starling_redis_password")
        assert need <= keys, (service, need - keys)
        for k in keys:
            assert k.removeprefix("starling_") in _secret_fields(SETTINGS[service])


def test_k8s_nodes_drain_before_they_stop(manifests: list[dict[str, Any]]) -> None:
    node = _workloads(manifests)["connection"]
    config = _config(manifests, "starling-connection")
    pod = node["spec"]["template"]["spec"]
    hook = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "starling drain" in hook and "--wait" in hook and "127.0.0.1:7010" in hook
    timeout = float(config["STARLING_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > timeout + ConnectionSettings().shutdown_grace_s
