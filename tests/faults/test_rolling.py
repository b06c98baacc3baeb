"""A mesh as it is deployed (issue 18): a NATS cluster of three (JetStream streams replicated
three ways), two connection nodes, two routers, two session instances, `QUEUES` queue
instances, and a rule that reads every message of the load (so each PUBACK also waits for the
replicated RULES stream). Under the fault load (tests/faults/harness.py):

- one NATS server is SIGKILLed (the RULES stream's leader: the stream on the PUBACK path
  elects another) and started again;
- a rolling upgrade: every node drained with `starling drain NODE --wait` and started again,
  then every back-office instance and every NATS server stopped with SIGTERM and started
  again, one at a time, each serving before the next.

Each time the checker counts: no acknowledged message lost to a persistent session, each
publisher's messages in order there, every acknowledged message handed to the rule's action
(a Redis stream per topic). In the upgrade no client sees anything it cannot recover from:
the only DISCONNECT is 0x9C (Use another server) with a Server Reference, which every client
gets and the MQTT 5 clients follow; no PUBACK/PUBREC/PUBCOMP is refused and the QoS 2
publisher's session survives.

The nodes keep no route table copies (`route_copy_max_subscriptions` 0): every QoS>=1 publish
goes through a router, so router restarts are on the publish path.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import nats
import pytest
import redis

from services.cli.launcher import BACK_OFFICE, Launcher
from services.common.bus import subjects
from services.common.mqtt.reason import ReasonCode as RC
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from tests.e2e.clients import Paho
from tests.faults.checker import parse
from tests.faults.harness import MAX_PACKET, Load, resume_s, run_under_load
from tests.faults.load import Publisher, Subscriber
from tests.poll import holds_within

pytestmark = pytest.mark.timeout(240)

NATS_SERVERS = 3
# Queue instances. One until the queue service runs as several (issue 18, branch scaleq);
# then 2, and the upgrade restarts each in turn like the other instances.
QUEUES = 2
STARLING = [sys.executable, "-m", "services.cli.main"]
TENANT = "default"  # the anonymous clients of the load (no username)
RULES_ACK_WAIT_S = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(
        data_dir=tmp_path_factory.mktemp("rolling") / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
            "STARLING_ROUTE_COPY_MAX_SUBSCRIPTIONS": "0",
            # A pulled batch whose reply died with a NATS server comes again after this (not
            # the default 60 s): the rule's outputs are late then, not lost.
            "STARLING_RULES_ACK_WAIT_S": str(RULES_ACK_WAIT_S),
        },
        instances={"router": 2, "session": 2, "queue": QUEUES},
        nats_servers=NATS_SERVERS,
    )
    launcher.start(timeout_s=90)
    try:
        yield launcher
    finally:
        launcher.stop()


def _redis(launcher: Launcher) -> redis.Redis:
    return redis.Redis.from_url(_redis_url(launcher))


def _redis_url(launcher: Launcher) -> str:
    port = launcher.mesh.by_name("redis").port
    return f"redis://:{launcher.secrets.redis_password}@127.0.0.1:{port}/0"


@pytest.fixture(scope="module")
def rule(cluster: Launcher) -> Iterator[redis.Redis]:
    """A rule reading every load topic (`ft/#`) into a Redis stream named after the topic;
    returns once both nodes store what it reads (a probe from each arrived)."""
    rid = f"r-{uuid.uuid4().hex[:6]}"
    md = [("authorization", f"Bearer {cluster.admin_token}")]
    addr = f"127.0.0.1:{cluster.mesh.by_name('rules').grpc_port}"
    with grpc.insecure_channel(addr) as ch:
        pb_grpc.RulesAdminServiceStub(ch).CreateRule(
            pb.CreateRuleRequest(
                rule=pb.Rule(
                    tenant=TENANT,
                    rule_id=rid,
                    sql='SELECT payload FROM "ft/#"',
                    enabled=True,
                    actions=[pb.Action(kind="redis", params={"url": _redis_url(cluster)})],
                )
            ),
            metadata=md,
        )
    r = _redis(cluster)
    for i in range(cluster.nodes):
        probe = Paho(cluster.mesh.by_name(f"connection-{i}").port)
        probe.connect()
        topic = f"ft/probe-{rid}/{i}"

        def arrived(p: Paho = probe, t: str = topic) -> bool:
            p.c.publish(t, b"probe:0:", qos=1).wait_for_publish(5)
            return bool(r.xlen(t))

        assert holds_within(arrived, 20), f"the rule never read node {i}'s messages"
        probe.close()
    yield r
    r.close()


def _rule_missed(r: redis.Redis, load: Load) -> list[tuple[str, int]]:
    """Acknowledged publishes of this load that the rule's action has not received (yet)."""
    got: set[tuple[str, int]] = set()
    for p in load.publishers:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = r.xrange(p.topic)  # type: ignore[assignment]
        got |= {parse(fields[b"payload"]) for _, fields in entries}
    return sorted(load.checker.acknowledged() - got)


def _check_rule(r: redis.Redis, load: Load) -> None:
    missed: list[tuple[str, int]] = []

    def none_missed() -> bool:
        missed[:] = _rule_missed(r, load)
        return not missed

    settle_s = 20 + 2 * RULES_ACK_WAIT_S
    assert holds_within(none_missed, settle_s), f"the rule never got {len(missed)}: {missed[:10]}"


def _stream_leader(launcher: Launcher, stream: str) -> str:
    """The NATS server (component name = server_name) leading `stream`. Right after its
    leader (or the meta leader) was killed, the JetStream API answers nothing until the
    survivors elect new ones: asked again for up to 30 s."""

    async def ask() -> str:
        urls = [f"nats://127.0.0.1:{c.port}" for c in launcher.mesh.components if c.kind == "nats"]
        nc = await nats.connect(urls, user="operator", password=launcher.secrets.nats["operator"])
        deadline = time.monotonic() + 30
        try:
            while True:
                try:
                    info = await nc.jetstream().stream_info(stream)
                except nats.errors.TimeoutError:
                    if time.monotonic() > deadline:
                        raise
                    continue
                assert info.config.num_replicas == 3, info.config
                if info.cluster is not None and info.cluster.leader:
                    return str(info.cluster.leader)
                assert time.monotonic() < deadline, f"no leader of {stream}: {info}"
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    return asyncio.run(ask())


def test_sigkill_of_a_nats_server_under_load(cluster: Launcher, rule: redis.Redis) -> None:
    figures: dict[str, object] = {}
    loads: list[Load] = []

    def inject(load: Load) -> None:
        loads.append(load)
        victim = _stream_leader(cluster, subjects.RULES_STREAM)
        killed = time.monotonic()
        cluster.kill(victim)
        figures["killed"] = victim
        figures["resumed_s"] = round(resume_s(load, killed), 2)
        figures["new_leader"] = _stream_leader(cluster, subjects.RULES_STREAM)
        time.sleep(1.0)  # load on two servers
        cluster.restart(victim)  # serving = its JetStream caught up (/healthz)

    run_under_load(
        cluster,
        "NATS cluster of 3: SIGKILL one server",
        "the RULES stream leader of a 3-server NATS cluster SIGKILLed (restarted after)",
        inject,
        # Core NATS keeps no copy: what the killed server was carrying to the clean
        # subscriber is gone (at most once); persistent sessions and the rule lose nothing.
        clean_may_lose=True,
    )
    print(f"NATS kill: {figures}")
    assert figures["new_leader"] != figures["killed"]
    _check_rule(rule, loads[0])


def _drain(launcher: Launcher, node: str) -> dict[str, object]:
    """`starling drain NODE --wait`, as an operator runs it."""
    out = subprocess.run(
        [*STARLING, "drain", node, "--data-dir", launcher.mesh.data_dir, "--wait"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_rolling_upgrade_under_load(cluster: Launcher, rule: redis.Redis) -> None:
    loads: list[Load] = []
    steps: list[tuple[str, float, float]] = []  # (component, seconds to stop, to serve again)

    def inject(load: Load) -> None:
        loads.append(load)
        for i in range(cluster.nodes):
            node = f"connection-{i}"
            began = time.monotonic()
            assert _drain(cluster, node)["exited"] is True
            assert cluster.procs[node].wait(10) == 0  # a drained node ends normally
            stopped = time.monotonic()
            cluster.restart(node)
            steps.append((node, round(stopped - began, 1), round(time.monotonic() - stopped, 1)))
        rest = [c.name for c in cluster.mesh.components if c.service in BACK_OFFICE]
        rest += [c.name for c in cluster.mesh.components if c.kind == "nats"]
        for name in rest:
            began = time.monotonic()
            cluster.terminate(name)
            stopped = time.monotonic()
            cluster.restart(name)
            steps.append((name, round(stopped - began, 1), round(time.monotonic() - stopped, 1)))

    run_under_load(
        cluster,
        "rolling upgrade",
        "every node drained and restarted, then every back-office instance and NATS server "
        "SIGTERMed and restarted, one at a time",
        inject,
        # The clean subscriber's session ends when its node drains (clean start): what is
        # published before it is back is not its (counted).
        clean_may_lose=True,
    )
    print(f"rolling upgrade steps (s): {steps}")
    _check_moved(loads[0])
    _check_rule(rule, loads[0])


def _check_moved(load: Load) -> None:
    """Every client of the load was moved by the drains, and moved in good order."""
    clients: list[Publisher | Subscriber] = [*load.publishers, *load.subscribers]
    told = [c.name for c in clients if c.server_disconnects]
    # Every client was moved (both nodes drained) and told so: DISCONNECT 0x9C with a Server
    # Reference, the only DISCONNECT any got, which they followed. Even one sending when its
    # turn came reads it (the node closes lingering: services/connection/linger.py).
    assert set(told) == {c.name for c in clients}, f"not told: {told}"
    for c in clients:
        assert c.connects > 1, f"{c.name} was never moved"
        for reason, reference in c.server_disconnects:
            assert reason == RC.USE_ANOTHER_SERVER and reference, (c.name, c.server_disconnects)
    for p in load.publishers:  # the reference named a node of the mesh, and they went there
        assert p.followed == len(p.server_disconnects), (p.name, p.server_disconnects)
    print(f"told 0x9C with a Server Reference: {told}")
    for p in load.publishers:
        assert p.sessions_lost == 0, f"{p.name} lost its session"
        # No PUBACK/PUBREC refused, and no PUBCOMP 0x92 (Packet Identifier not found) for a
        # PUBREL sent again on the next node: a draining node writes the PUBCOMP of every
        # release it wrote before its DISCONNECT.
        assert p.refusals == [], p.refusals


def test_every_component_serves_after_the_upgrade(cluster: Launcher) -> None:
    from services.cli.status import run_status

    # A restarted clustered nats-server reports STARTING until its JetStream has caught up,
    # and a health check under the suite's load can time out once: every component serves
    # within a few seconds of the upgrade's end, as `starling status` shows an operator.
    deadline = time.monotonic() + 20
    while run_status(Path(cluster.mesh.data_dir)) != 0:
        assert time.monotonic() < deadline, "a component does not serve 20 s after the upgrade"
        time.sleep(0.5)
