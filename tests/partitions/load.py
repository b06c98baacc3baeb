"""The partition suite's load and its observers, all through HAProxy.

`PartitionLoad` is the fault suite's load (tests/faults/load.py clients, tests/faults/
checker.py ledger) pointed at the load balancer: three publishers (QoS 1, QoS 1, QoS 2),
four persistent subscribers (two taking QoS 2, so the QoS 2 stream arrives at QoS 2, two
QoS 1) and two clean ones. Round robin spreads them over both nodes.

`Balancer` reads HAProxy's runtime API: which node each open client connection goes to
(`show sess`) and which nodes are in the pool (`show stat`). `TwoNodesWatch` samples, every
quarter second while the load runs, (a) HAProxy's sessions, mapped back to client ids by the
clients' local ports, and (b) every node's own count of open connections (GetNodeStats over
its admin API): a client id with connections to two nodes at once, or nodes holding more
connections than there are clients, is a breach.
"""

from __future__ import annotations

import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.common.rpc.credentials import MESH_METADATA_KEY
from starling.connection.v1 import connection_pb2 as pb
from starling.connection.v1 import connection_pb2_grpc as pb_grpc
from tests.faults.checker import Checker, Verdict
from tests.faults.load import Publisher, Subscriber
from tests.poll import holds_within

SESSION = re.compile(r"src=[\d.]+:(\d+) fe=\S+ be=\S+ srv=(\S+)")


class Balancer:
    """HAProxy's runtime API on its stats socket."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock

    def ask(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2.0)
            s.connect(str(self.sock))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def sessions(self) -> list[tuple[int, str]]:
        """(client's local port, node) of every open client connection."""
        return [(int(p), srv) for p, srv in SESSION.findall(self.ask("show sess"))]

    def up(self) -> set[str]:
        """Nodes HAProxy sends new connections to."""
        rows = [line.split(",") for line in self.ask("show stat").splitlines()]
        return {
            r[1]
            for r in rows
            if len(r) > 17 and r[0] == "nodes" and r[1] != "BACKEND" and r[17] == "UP"
        }


class PartitionLoad:
    """The load: started, then stopped and settled by `finish`."""

    def __init__(self, lb_port: int, rate: float = 60.0) -> None:
        self.checker = c = Checker()
        self._probe_lock = threading.Lock()
        self._probes = 0
        self._quiet_after = 0.0
        base = f"pt/{uuid.uuid4().hex[:8]}"

        def ports() -> list[int]:
            return [lb_port]

        self.subscribers = [
            Subscriber("persistent-q2a", ports, 0, True, f"{base}/#", c, 2),
            Subscriber("persistent-q2b", ports, 0, True, f"{base}/#", c, 2),
            Subscriber("persistent-q1a", ports, 0, True, f"{base}/#", c, 1),
            Subscriber("persistent-q1b", ports, 0, True, f"{base}/#", c, 1),
            Subscriber("clean-a", ports, 0, False, f"{base}/#", c, 2),
            Subscriber("clean-b", ports, 0, False, f"{base}/#", c, 2),
        ]
        self.publishers = [
            Publisher("q1-a", ports, 0, 1, f"{base}/a", c, rate),
            Publisher("q1-b", ports, 0, 1, f"{base}/b", c, rate),
            Publisher("q2-c", ports, 0, 2, f"{base}/c", c, rate),
        ]

    @contextmanager
    def probing(self) -> Iterator[None]:
        """Around the test's own extra connections (probes): the nodes' counts include
        them, so the watch does not compare counts meanwhile, nor for a second after."""
        with self._probe_lock:
            self._probes += 1
        try:
            yield
        finally:
            with self._probe_lock:
                self._probes -= 1
                self._quiet_after = time.monotonic() + 1.0

    def probes_settled(self) -> bool:
        with self._probe_lock:
            return self._probes == 0 and time.monotonic() > self._quiet_after

    @property
    def clients(self) -> list[Publisher | Subscriber]:
        return [*self.subscribers, *self.publishers]

    def local_ports(self) -> dict[int, str]:
        """The local port of each client's open connection -> its client id."""
        found = {}
        for cl in self.clients:
            if isinstance(cl, Publisher):
                raw = cl._raw
                sock = raw.sock if raw is not None else None
                cid = cl.client_id
            else:
                sock = cl.c.socket()
                cid = cl.c._client_id.decode()
            try:
                if sock is not None:
                    found[sock.getsockname()[1]] = cid
            except OSError:
                pass
        return found

    def start(self) -> None:
        for s in self.subscribers:
            s.start()
        for p in self.publishers:
            p.start()

    def connects(self) -> dict[str, int]:
        return {cl.name: cl.connects for cl in self.clients}

    def server_disconnects(self) -> dict[str, list[tuple[int, str]]]:
        return {cl.name: cl.server_disconnects for cl in self.clients if cl.server_disconnects}

    def finish(self, settle_s: float = 60.0) -> Verdict:
        """Stop publishing; wait until every publish is acknowledged and every acknowledged
        one reached every persistent session; the verdict."""
        for p in self.publishers:
            p.pause()
        # Settling only: the verdict below counts whatever is still missing.
        holds_within(lambda: all(p.unacked() == 0 for p in self.publishers), settle_s, 0.1)
        persistent = [s.name for s in self.subscribers if s.persistent]
        holds_within(lambda: all(self.checker.missing(n) == 0 for n in persistent), settle_s, 0.1)
        self.close()
        return self.checker.verdict()

    def close(self) -> None:
        for cl in self.clients:
            cl.stop()


@dataclass
class WatchReport:
    samples: int = 0
    two_nodes: list[tuple[float, str, list[str]]] = field(default_factory=list)
    excess: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # node counts
    stats_failures: int = 0  # GetNodeStats calls that got no answer
    # Longest time (s) a publisher got no acknowledgement, a subscriber no new message.
    ack_gap_s: dict[str, float] = field(default_factory=dict)
    delivery_gap_s: dict[str, float] = field(default_factory=dict)


class TwoNodesWatch:
    """Samples HAProxy's sessions and the nodes' connection counts on a thread of its own."""

    def __init__(
        self, load: PartitionLoad, lb: Balancer, nodes: dict[str, str], token: str, secret: str
    ) -> None:
        self._load = load
        self._lb = lb
        self._nodes = nodes  # node -> gRPC address
        self._meta = (("authorization", f"Bearer {token}"), (MESH_METADATA_KEY, secret))
        self._ports: dict[int, str] = {}  # every local port a client used -> its client id
        self.report = WatchReport()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()
        self._last: dict[str, tuple[int, float]] = {}  # client -> (count, since when)
        self._over = False  # the last sample counted more connections than clients

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> WatchReport:
        self._stop.set()
        self._thread.join(10)
        return self.report

    def _run(self) -> None:
        channels = {n: grpc.insecure_channel(a) for n, a in self._nodes.items()}
        stubs = {n: pb_grpc.ConnectionAdminServiceStub(ch) for n, ch in channels.items()}
        try:
            while not self._stop.wait(0.25):
                self._sample(stubs)
        finally:
            for ch in channels.values():
                ch.close()

    def _sample(self, stubs: dict[str, pb_grpc.ConnectionAdminServiceStub]) -> None:
        at = round(time.monotonic() - self._started, 2)
        self._ports.update(self._load.local_ports())
        held: dict[str, set[str]] = {}
        for port, node in self._lb.sessions():
            cid = self._ports.get(port)
            if cid is not None:
                held.setdefault(cid, set()).add(node)
        for cid, nodes in held.items():
            if len(nodes) > 1:
                self.report.two_nodes.append((at, cid, sorted(nodes)))
        counts = {}
        for node, stub in stubs.items():
            try:
                r = stub.GetNodeStats(pb.GetNodeStatsRequest(), metadata=self._meta, timeout=1.0)
                counts[node] = r.stats.connections
            except grpc.RpcError:
                self.report.stats_failures += 1
        # More connections than clients in two samples running: a connection the node
        # keeps for a client that is gone (one sample may catch HAProxy's health check,
        # which the node counts while it lasts).
        settled = self._load.probes_settled()
        over = settled and len(counts) == len(stubs)
        over = over and sum(counts.values()) > len(self._load.clients)
        if over and self._over:
            self.report.excess.append((at, counts))
        self._over = over
        self._gaps()
        self.report.samples += 1

    def _gaps(self) -> None:
        """Stalls seen by the clients: the longest stretch without a new acknowledgement
        (publishers) or a new message (subscribers)."""
        now = time.monotonic()
        counts = {p.name: self._load.checker.acked_by(p.name) for p in self._load.publishers}
        counts |= {
            s.name: self._load.checker.delivered_count(s.name) for s in self._load.subscribers
        }
        for name, count in counts.items():
            seen, since = self._last.get(name, (-1, now))
            if count != seen:
                self._last[name] = (count, now)
                continue
            gaps = self.report.ack_gap_s if name.startswith("q") else self.report.delivery_gap_s
            gaps[name] = max(gaps.get(name, 0.0), round(now - since, 1))
