"""What a load run reports: `Result` (a throughput or latency run's counts, rates,
percentiles and CPU per message) and `ConnectRate` (a connection-rate run, holding the
clients it left open). bench/loadgen.py fills them; bench/scenarios.py turns them into cells."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.client import Client


@dataclass
class Result:
    sent: int = 0
    received: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    # CPU seconds each of `cpu_pids` used during the measured window, in their order.
    cpu_s: list[float] = field(default_factory=list)
    loadgen_cpu_s: float = 0.0  # this process, same window: is the generator the bottleneck?
    stalls: int = 0  # closed loop: windows given up as lost after STALL_S without a delivery
    max_in_flight: int = 0  # closed loop: most messages of one pair sent and not yet received

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0

    def cpu_us_per_message(self, index: int = 0) -> float:
        """CPU microseconds of `cpu_pids[index]` per message delivered in the window."""
        if not self.received or index >= len(self.cpu_s):
            return float("nan")
        return self.cpu_s[index] / self.received * 1e6

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class ConnectRate:
    attempted: int
    connected: int  # CONNACK with return code 0
    seconds: float  # first CONNECT sent to last CONNACK received
    clients: list[Client] = field(default_factory=list, repr=False)

    @property
    def rate(self) -> float:
        return self.connected / self.seconds if self.seconds else 0.0

    def close(self) -> None:
        for c in self.clients:
            if c.transport is not None:
                c.transport.close()
        self.clients.clear()
