"""The persistent QoS 1 rows of `make bench` alone, beside their transient reference.

`python -m bench.persistent [rounds]` starts one mesh and runs, `rounds` times (default 3):
"8 pairs, QoS 1" (transient), "8 pairs, QoS 1, persistent subscribers" and "latency at
1,000 msg/s, QoS 1, persistent subscriber"; then prints each round's persistent/transient
ratio and the medians. The ratio is measured within one round so other load on a shared
machine weighs on both sides of it alike. Numbers are measurements, never assertions.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from bench import loadgen
from bench.run import SECONDS, start_starling


async def one_round(port: int) -> tuple[float, float, float, float]:
    transient = await loadgen.throughput(port, 8, 8, "pairs", 1, SECONDS)
    persistent = await loadgen.throughput(port, 8, 8, "pairs", 1, SECONDS, persistent=True)
    lat = await loadgen.latency(port, 1, rate_per_s=1000, persistent=True)
    return transient.rate, persistent.rate, lat.pct(0.5), lat.pct(0.99)


def main() -> int:
    import uvloop

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rows: list[tuple[float, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_starling(Path(tmp) / "starling")
        try:
            for i in range(rounds):
                t, p, p50, p99 = uvloop.run(one_round(broker.port))
                rows.append((t, p, p50, p99))
                print(
                    f"round {i + 1}: transient {t:,.0f} msg/s, persistent {p:,.0f} msg/s "
                    f"(ratio {p / t:.2f}), persistent latency p50 {p50:.2f} ms p99 {p99:.2f} ms",
                    flush=True,
                )
        finally:
            broker.stop()
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    ratio = statistics.median(p / t for t, p, _, _ in rows)
    print(
        f"median: transient {med[0]:,.0f} msg/s, persistent {med[1]:,.0f} msg/s, "
        f"ratio {ratio:.2f}, p50 {med[2]:.2f} ms, p99 {med[3]:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
