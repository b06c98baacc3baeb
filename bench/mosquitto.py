"""Mosquitto's side of the bench: a Mosquitto of its own on a free port (None when it is
not installed), and the calibration line that a run starts with (a CPython loop and what a
fresh Mosquitto moves), so that runs on other machines or days can be compared."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench import loadgen
from bench.broker import Broker
from bench.machine import python_loop_seconds
from bench.scenarios import SECONDS
from services.cli.ports import free_port, port_open

T = TypeVar("T")


def on_mosquitto(folder: Path, run: Callable[[Broker], T]) -> T | None:
    """`run` against a Mosquitto of its own, stopped afterwards; None (said on stdout) when
    Mosquitto is not installed."""
    broker = start_mosquitto(folder)
    if broker is None:
        print("mosquitto not installed")
        return None
    try:
        return run(broker)
    finally:
        broker.stop()


def medians_line(summary: dict[str, float], unit: str) -> str:
    """ "Starling X<unit>, Mosquitto Y<unit> (ratio Rx)": each broker's median, and their
    ratio when Mosquitto ran."""
    line = ", ".join(f"{k} {v:,.0f}{unit}" for k, v in summary.items())
    if "Mosquitto" in summary:
        line += f" (ratio {summary['Starling'] / summary['Mosquitto']:.2f}x)"
    return line


def start_mosquitto(folder: Path) -> Broker | None:
    binary = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if binary is None:
        return None
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\n"
        "max_queued_messages 100000\npersistence false\nlog_type error\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            proc.kill()
            return None
        time.sleep(0.05)

    def stop() -> None:
        proc.terminate()
        proc.wait(10)

    version = subprocess.run([binary, "-h"], capture_output=True, text=True).stdout.split("\n")[0]
    return Broker(
        version.replace("mosquitto version", "Mosquitto").strip() or "Mosquitto",
        port,
        proc.pid,
        stop,
    )


@dataclass(frozen=True)
class Calibration:
    loop_s: float
    mosquitto: str  # "<name>, 8 pairs QoS 0 open loop: N msg/s", or why there is none

    def line(self) -> str:
        return (
            f"calibration: CPython {10_000_000:,}-step for loop {self.loop_s:.2f} s "
            f"(best of 3); {self.mosquitto}"
        )


def calibrate(folder: Path) -> Calibration:
    loop_s = python_loop_seconds()
    b = start_mosquitto(folder)
    if b is None:
        return Calibration(loop_s, "Mosquitto not installed")
    try:
        import uvloop

        r = uvloop.run(loadgen.throughput(b.port, 8, 8, "pairs", 0, SECONDS))
    finally:
        b.stop()
    return Calibration(loop_s, f"{b.name}, 8 pairs QoS 0 open loop: {r.rate:,.0f} msg/s")
