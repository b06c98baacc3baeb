"""What quotas cost end to end, in node CPU per message: `make bench`'s "quota limits on"
closed-loop pairs (QoS 0 and 1, the tenant limited far above what it sends) against the same
load without limits, on one mesh, interleaved (in alternating order) so that load from
elsewhere on a shared machine weighs on both alike. `python -m bench.quota_cost [rounds] [seconds]`.

Prints the node's (connection-0's) CPU microseconds per message delivered, from
/proc/<pid>/stat, per round and the median of each case: CPU, not the rate, because the
load generator shares the machine."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from bench.broker import Broker, start_starling
from bench.scenarios import quota_rounds


async def measure(b: Broker, rounds: int, seconds: float) -> None:
    for qos in (0, 1):
        got = await quota_rounds(b, qos, rounds, seconds)
        for off, on in zip(got["off"], got["on"], strict=True):
            for case, r in (("off", off), ("on", on)):
                us = r.cpu_us_per_message(0)
                print(f"QoS {qos} quotas {case:<3} {r.rate:9,.0f} msg/s  node {us:.2f} us/msg")
        off_us = statistics.median(r.cpu_us_per_message(0) for r in got["off"])
        on_us = statistics.median(r.cpu_us_per_message(0) for r in got["on"])
        print(
            f"QoS {qos}: median node CPU off {off_us:.2f} us, on {on_us:.2f} us "
            f"({on_us / off_us - 1:+.1%})"
        )


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
