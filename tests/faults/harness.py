"""The fault suite's mesh and its load scenario.

`fault_launcher` starts a two-node mesh of its own (these tests kill processes, so never the
shared `mesh`). `run_under_load` puts a steady load on it (three publishers: QoS 1 on each
node and QoS 2 on node 0; two persistent subscribers, one per node, and a clean one on node
0), injects a fault once messages flow, keeps publishing through it and after it, waits until
everything was acknowledged and delivered, and returns the checker's verdict; the figures go
to `FIGURES` for the summary at the end of the run (tests/faults/conftest.py).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.cli.launcher import Launcher
from tests.faults.checker import Checker, Verdict
from tests.faults.load import Publisher, Subscriber
from tests.poll import holds_within, wait_until

# Collected by every test of the run; printed as a table at the end (conftest.py) and, when
# STARLING_FAULT_FIGURES names a file, written there as JSON.
FIGURES: list[dict[str, Any]] = []

MAX_PACKET = 16 << 20  # room for the 8 MiB messages of test_large_messages


def _lease_figures(port: int) -> tuple[float, float] | None:
    """A node's (starling_node_fenced, starling_node_lease_age_seconds); None: no answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return None
    found: dict[str, float] = {}
    for line in text.decode().splitlines():
        name, _, value = line.partition(" ")
        if name.split("{")[0] in ("starling_node_fenced", "starling_node_lease_age_seconds"):
            found[name.split("{")[0]] = float(value)
    if len(found) < 2:
        return None
    return found["starling_node_fenced"], found["starling_node_lease_age_seconds"]


def wait_steady(launcher: Launcher, timeout_s: float = 30.0) -> None:
    """Until every node of `launcher` holds a fresh lease (unfenced, its latest heartbeat
    answered within the last second or so): a test that follows one which restarted the
    session service or Redis must not start while a node is about to fence and shed every
    client (services/connection/lease.py)."""
    ports = [c.metrics_port for c in launcher.mesh.components if c.name.startswith("connection-")]

    def steady(port: int) -> bool:
        figures = _lease_figures(port)
        return figures is not None and figures[0] == 0 and 0 <= figures[1] < 1.5

    wait_until(lambda: all(steady(p) for p in ports), timeout_s, "every node's lease fresh")


@contextmanager
def fault_launcher(
    folder: Path,
    nodes: int = 2,
    instances: dict[str, int] | None = None,
    nats_servers: int = 1,
    **env: str,
) -> Iterator[Launcher]:
    """`instances`, `nats_servers`: as Launcher's (several copies of back-office services,
    a NATS cluster)."""
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=nodes,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={
            "STARLING_LOG_LEVEL": "INFO",
            # A killed node's clients are released after 3 s, not 10.
            "STARLING_NODE_TIMEOUT_S": "3",
            "STARLING_MAX_PACKET_SIZE_BYTES": str(MAX_PACKET),
            # The load's clean subscriber is a Python client that can fall over 16 MiB (the
            # default) behind the 8 MiB messages on a loaded machine; the node then drops
            # for it, as it must (tests/connection/test_channel_publish_out.py). Here room
            # for all five, so a loss the checker sees is one the bound does not explain.
            "STARLING_MAX_QUEUED_BYTES": str(6 * MAX_PACKET),
            **env,
        },
        instances=instances,
        nats_servers=nats_servers,
    )
    launcher.start(timeout_s=90 if nats_servers > 1 else 60)
    try:
        yield launcher
    finally:
        launcher.stop()


def node_ports(launcher: Launcher) -> Callable[[], list[int]]:
    def ports() -> list[int]:
        return [launcher.mesh.by_name(f"connection-{i}").port for i in range(launcher.nodes)]

    return ports


def resume_s(load: Load, since: float) -> float:
    """Seconds from `since` until every publisher had 10 more messages acknowledged."""
    base = {p.name: load.checker.acked_by(p.name) for p in load.publishers}
    resumed: dict[str, float] = {}

    def all_resumed() -> bool:
        for p in load.publishers:
            if p.name not in resumed and load.checker.acked_by(p.name) >= base[p.name] + 10:
                resumed[p.name] = time.monotonic() - since
        return len(resumed) == len(load.publishers)

    assert holds_within(all_resumed, 30), f"publishing did not resume: {resumed}"
    return max(resumed.values())


def record(name: str, faults: str, verdict: Verdict, **extra: Any) -> None:
    figures = {"test": name, "faults": faults, **verdict.summary(), **extra}
    FIGURES.append(figures)
    print(f"\n{name}: {json.dumps(figures)}")
    out = os.environ.get("STARLING_FAULT_FIGURES")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(figures) + "\n")


class Load:
    """The standard load: started, then stopped and settled by `finish`."""

    def __init__(self, launcher: Launcher, rate: float = 150.0, moving_qos: int = 2) -> None:
        self.checker = Checker()
        base = f"ft/{uuid.uuid4().hex[:8]}"
        self.ports = ports = node_ports(launcher)
        self.base = base
        c = self.checker
        self.subscribers = [
            Subscriber("persistent-1", ports, 1, True, f"{base}/#", c, moving_qos),
            Subscriber("persistent-0", ports, 0, True, f"{base}/#", c),
            Subscriber("clean-0", ports, 0, False, f"{base}/#", c),
        ]
        self.publishers = [
            Publisher("q1-node0", ports, 0, 1, f"{base}/a", c, rate),
            Publisher("q1-node1", ports, 1, 1, f"{base}/b", c, rate),
            Publisher("q2-node0", ports, 0, 2, f"{base}/c", c, rate),
        ]

    def start(self) -> None:
        for s in self.subscribers:
            s.start()
        for p in self.publishers:
            p.start()
        # Messages flow end to end before the fault.
        assert holds_within(lambda: self.checker.delivered_count("persistent-1") >= 100, 20), (
            "no load before the fault"
        )

    def finish(self, settle_s: float = 45.0) -> Verdict:
        for p in self.publishers:
            p.pause()
        # Every publish acknowledged (clients resend what was in flight when they lost a
        # connection), then every acknowledged one delivered to the persistent sessions.
        holds_within(lambda: all(p.unacked() == 0 for p in self.publishers), settle_s)
        persistent = [s.name for s in self.subscribers if s.persistent]
        holds_within(lambda: all(self.checker.missing(n) == 0 for n in persistent), settle_s)
        self.close()
        return self.checker.verdict()

    def close(self) -> None:
        for c in [*self.publishers, *self.subscribers]:
            c.stop()

    def add(self, publisher: Publisher) -> Publisher:
        publisher.start()
        self.publishers.append(publisher)
        return publisher

    def reconnects(self) -> dict[str, int]:
        return {c.name: c.connects - 1 for c in [*self.publishers, *self.subscribers]}


def run_under_load(
    launcher: Launcher,
    name: str,
    faults: str,
    inject: Callable[[Load], None],
    after_s: float = 1.0,
    settle_s: float = 45.0,
    moving_qos: int = 2,
    clean_may_lose: bool = False,
    rate: float = 150.0,
    min_sent: int = 0,
    figures: dict[str, Any] | None = None,
) -> Verdict:
    """Load, `inject(load)` (it returns once the mesh serves again), `after_s` more of load,
    then settle; records the figures and checks the verdict. `moving_qos`: the subscription
    QoS of persistent-1, the subscriber on node 1 (the one that moves when node 1 fails).
    `clean_may_lose`: the fault hits the transient path (NATS, the publisher's node), where
    clean sessions get at most once (docs/failure-behaviour.md); counted, not asserted.
    `rate`: each publisher's messages per second; `min_sent`: the load goes on after the
    faults until at least this many messages were sent in all. `figures`: the test's own
    measurements (filled by `inject`), recorded with the verdict."""
    load = Load(launcher, rate=rate, moving_qos=moving_qos)
    try:
        load.start()
        started = time.monotonic()
        inject(load)
        time.sleep(after_s)  # load after the fault: steady state again, not a timing check
        if min_sent:
            assert holds_within(lambda: load.checker.sent_count() >= min_sent, 120), (
                f"{load.checker.sent_count()} of {min_sent} messages sent"
            )
        verdict = load.finish(settle_s)
    except BaseException:
        load.close()  # no clients left running into the next test
        raise
    unacked = {p.name: p.unacked() for p in load.publishers if p.unacked()}
    record(
        name,
        faults,
        verdict,
        fault_s=round(time.monotonic() - started, 1),
        reconnects=load.reconnects(),
        unacked=unacked,
        **(figures or {}),
    )
    verdict.check(clean_may_lose)
    assert not unacked, f"publishes never acknowledged: {unacked}"
    return verdict


def _back_after(f: dict[str, Any]) -> str:
    """Seconds from a Redis failure until CONNECTs were accepted again, where measured."""
    seconds = f.get("failover_s", f.get("connect_gap_s"))
    return "-" if seconds is None else f"{float(seconds):.1f} s"


def table_lines(figures: list[dict[str, Any]]) -> list[str]:
    """The fault suite's figures as a Markdown table."""
    lines = [
        "| test | faults injected | sent | acked | delivered | lost | QoS 2 duplicates "
        "| QoS 1 duplicates | order violations | clean subscriber lost | CONNECTs back after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        lines.append(
            f"| {f['test']} | {f['faults']} | {f['sent']} | {f['acked']} | {f['delivered']} "
            f"| {f['lost']} | {f['qos2_duplicates']} | {f['qos1_duplicates']} "
            f"| {f['order_violations']} | {f.get('clean_lost', '-')} | {_back_after(f)} |"
        )
    return lines
