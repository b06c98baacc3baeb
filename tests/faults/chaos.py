"""A soak under random faults: `python -m tests.faults.chaos [--minutes M] [--seed S]`.

The fault suite's load (tests/faults/harness.py: QoS 1 publishers on both nodes, a QoS 2
publisher, persistent subscribers on both nodes, one of them moving at QoS 2, and a clean
one) runs on a two-node mesh with two instances of the router, the queue and the session
service, for M minutes (default 4). Every 0.5-4 s one to three components, drawn at random
from the nodes, those instances, Redis and the NATS servers (`--nats 3`: a cluster, of which
at most one server is down at a time), are stopped (SIGKILL, or SIGTERM for a service), left
down for up to 2 s, and started again (NATS and Redis first, as an orchestrator would have
them back). In about one round in seven a node is also drained meanwhile (`starling drain
NODE --wait`, the rolling-upgrade step), and started again once it has exited; a drain that
fails counts against the verdict. Then the publishers stop, everything is settled, and the
checker's verdict is printed: lost (acknowledged, never delivered to a persistent session),
QoS 2 duplicates and order violations must be 0; clean-session losses are counted, as the
transient path is at most once across a fault. Exit status 0 when the verdict holds.

It runs for minutes, so it is not part of `make test`; its figures are in
docs/failure-behaviour.md. The seed makes the fault schedule repeatable (the timing of the
processes is not).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from services.cli.launcher import Launcher
from tests.faults.harness import Load, fault_launcher
from tests.faults.test_under_load import heal

INSTANCES = {"router": 2, "queue": 2, "session": 2}
DRAIN_SHARE = 0.15  # of the rounds, in which a node is also drained
STARLING = [sys.executable, "-m", "services.cli.main"]


def victims(launcher: Launcher) -> list[str]:
    """What may be stopped: the nodes, the instances above, Redis and every NATS server."""
    services = [f"{s}{'' if i == 0 else f'-{i}'}" for s, n in INSTANCES.items() for i in range(n)]
    return ["connection-0", "connection-1", *services, "redis", *infra(launcher)[1:]]


def infra(launcher: Launcher) -> list[str]:
    """Redis and the NATS servers (killed only: their restart is a cold start either way)."""
    return ["redis", *(c.name for c in launcher.mesh.components if c.kind == "nats")]


def pick(launcher: Launcher, rng: random.Random) -> list[str]:
    """One to three victims; with a NATS cluster, at most one of its servers at a time (two
    of three down is a lost quorum, an outage the cluster is not built to ride out)."""
    chosen = rng.sample(victims(launcher), rng.choice([1, 1, 2, 3]))
    nats = [n for n in chosen if n.startswith("nats")]
    if launcher.nats_servers > 1 and len(nats) > 1:
        chosen = [n for n in chosen if n not in nats[1:]]
    return chosen


def one_round(launcher: Launcher, rng: random.Random, faults: list[str]) -> str:
    """Stop the victims (and maybe drain a node meanwhile), start them again; what a failed
    drain said ("" if none failed)."""
    chosen = pick(launcher, rng)
    drain = None
    if rng.random() < DRAIN_SHARE:
        # A node drained (`starling drain NODE --wait`, as in a rolling upgrade) while the
        # other victims fail around it.
        draining = rng.choice(["connection-0", "connection-1"])
        chosen = [n for n in chosen if n != draining]
        faults.append(f"{draining} drain")
        drain = subprocess.Popen(
            [*STARLING, "drain", draining, "--data-dir", launcher.mesh.data_dir, "--wait"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    cold = infra(launcher)
    for name in chosen:
        term = name not in cold and rng.random() < 0.5
        faults.append(f"{name} {'SIGTERM' if term else 'SIGKILL'}")
        (launcher.terminate if term else launcher.kill)(name)
        time.sleep(rng.uniform(0, 0.5))
    time.sleep(rng.uniform(0, 2.0))
    for name in sorted(chosen, key=lambda n: n not in cold):
        launcher.restart(name)
    failed = ""
    if drain is not None:
        _, err = drain.communicate(timeout=120)
        if drain.returncode != 0:
            failed = f"{draining}: {err.strip()[-300:]}"
        launcher.restart(draining)
    heal(launcher)
    return failed


def soak(launcher: Launcher, minutes: float, rng: random.Random) -> bool:
    """Run the load under faults, print what happened; whether the verdict held."""
    load = Load(launcher, rate=100.0, moving_qos=2)
    faults: list[str] = []
    failed_drains: list[str] = []
    try:
        load.start()
        end = time.monotonic() + minutes * 60
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.5, 4.0))
            failed = one_round(launcher, rng, faults)
            if failed:
                failed_drains.append(failed)
        verdict = load.finish(120)
    except BaseException:
        print(f"faults so far: {faults}", flush=True)
        load.close()
        raise
    unacked = {p.name: p.unacked() for p in load.publishers if p.unacked()}
    print(f"{len(faults)} faults in {minutes:g} min: {', '.join(faults)}")
    print(f"verdict: {verdict.summary()}")
    print(f"never acknowledged: {unacked or 'none'}")
    # Publishes the broker refused (PUBACK/PUBREC reason code >= 0x80): no promise was made.
    refused = Counter(
        f"{kind} 0x{code:02X}" for p in load.publishers for kind, code, _ in p.refusals
    )
    print(f"refused: {dict(refused) or 'none'}")
    print(f"failed drains: {failed_drains or 'none'}")
    try:
        verdict.check(clean_may_lose=True)
    except AssertionError as exc:
        print(f"FAILED: {exc}")
        return False
    return not unacked and not failed_drains


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nats", type=int, default=1, help="NATS servers (3: a cluster)")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="starling-chaos-"))
    try:
        with fault_launcher(folder, instances=INSTANCES, nats_servers=args.nats) as launcher:
            held = soak(launcher, args.minutes, random.Random(args.seed))
    finally:
        print(f"logs: {folder / 'run' / 'logs'}")
    print("verdict holds" if held else "verdict FAILED")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
