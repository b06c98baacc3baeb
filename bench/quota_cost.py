"""What quotas cost end to end, in node CPU per message: `make bench`'s "quota limits on"
closed-loop pairs (QoS 0 and 1, the tenant limited far above what it sends) against the same
load without limits, on one mesh, interleaved so that load from elsewhere on a shared
machine weighs on both alike. `python -m bench.quota_cost [rounds] [seconds]`.

Prints the node's (connection-0's) CPU microseconds per message delivered, from
/proc/<pid>/stat, per round and the median of each case: CPU, not the rate, because the
load generator shares the machine."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from bench import loadgen
from bench.run import WINDOW, Broker, start_starling


async def measure(b: Broker, rounds: int, seconds: float) -> None:
    assert b.set_limits is not None
    got: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for qos in (0, 1):
            for case in ("off", "on"):
                if case == "on":
                    await b.set_limits(100_000_000, 100_000_000_000)
                await asyncio.sleep(1)  # the nodes drop their buckets and lease again
                r = await loadgen.throughput(
                    b.port, 8, 8, "pairs", qos, seconds, window=WINDOW, cpu_pids=b.pids
                )
                if case == "on":
                    await b.set_limits(0, 0)
                us = r.cpu_us_per_message(0)
                got.setdefault((qos, case), []).append(us)
                print(f"QoS {qos} quotas {case:<3} {r.rate:9,.0f} msg/s  node {us:.2f} us/msg")
    for qos in (0, 1):
        off = statistics.median(got[(qos, "off")])
        on = statistics.median(got[(qos, "on")])
        print(f"QoS {qos}: median node CPU off {off:.2f} us, on {on:.2f} us ({on / off - 1:+.1%})")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    with tempfile.TemporaryDirectory() as folder:
        b = start_starling(Path(folder))  # outside the event loop: it waits for health
        try:
            asyncio.run(measure(b, rounds, seconds))
        finally:
            b.stop()


if __name__ == "__main__":
    main()
