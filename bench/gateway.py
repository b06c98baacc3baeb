"""The gateway's HTTP publish API and CoAP gateway: publishes a second and the gateway's CPU
per message.

`python -m bench.gateway [--seconds S] [--concurrency N]` starts a one-node mesh
(bench/broker.py's settings), then for S seconds each: HTTP `POST /api/v5/publish` at QoS 0
and at QoS 1 (a tenant admin token; keep-alive connections, N requests in flight, 64 by
default), then CoAP `POST /ps/{topic}` at QoS 0 and 1 (N requests in flight from one aiocoap
client). One MQTT subscriber of the topic stays connected to the node, so every message
really goes through NATS to a subscriber. CPU per message is the gateway process's utime +
stime from /proc/<pid>/stat over the round divided by the publishes answered in it; the
load generator (this process) shares the machine's cores, so a rate may be its limit.
Numbers are measurements of this machine, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiocoap
import aiohttp

from bench.broker import starling_launcher
from bench.machine import cpu_seconds, python_loop_seconds
from services.cli.launcher import Launcher
from services.session.client import SessionAdminClient
from services.session.token_client import TokenAdminClient

TENANT = "bench"
PAYLOAD = "x" * 64


@dataclass(frozen=True, slots=True)
class Round:
    name: str
    done: int
    failed: int
    seconds: float
    cpu_s: float  # the gateway's
    load_cpu_s: float  # this process's (the load generator)
    mesh_cpu_s: float  # every process of the mesh, the gateway's included

    def line(self) -> str:
        rate = self.done / self.seconds
        cpu_us = self.cpu_s / max(self.done, 1) * 1e6
        mesh_us = self.mesh_cpu_s / max(self.done, 1) * 1e6
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"{self.name:<28} {rate:>7,.0f} msg/s; CPU per message: gateway {cpu_us:>4.0f} µs, "
            f"whole mesh {mesh_us:>4.0f} µs (gateway at {self.cpu_s / self.seconds:.0%} of a "
            f"core, load generator {self.load_cpu_s / self.seconds:.0%}){failed}"
        )


async def _run(
    name: str,
    pids: list[int],
    seconds: float,
    concurrency: int,
    one: Callable[[int], Awaitable[bool]],
) -> Round:
    """`concurrency` loops calling `one` for `seconds`; the CPU of the gateway (`pids[0]`),
    of every mesh process (`pids`) and of this one over that time."""
    done = failed = 0
    deadline = time.monotonic() + seconds

    async def loop(n: int) -> None:
        nonlocal done, failed
        while time.monotonic() < deadline:
            if await one(n):
                done += 1
            else:
                failed += 1

    me = os.getpid()
    before = [cpu_seconds(p) for p in pids]
    load0, t0 = cpu_seconds(me), time.monotonic()
    await asyncio.gather(*(loop(n) for n in range(concurrency)))
    used = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    return Round(
        name, done, failed, time.monotonic() - t0, used[0], cpu_seconds(me) - load0, sum(used)
    )


async def http_rounds(
    base: str, token: str, pids: list[int], args: argparse.Namespace
) -> list[Round]:
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    rounds = []
    async with aiohttp.ClientSession(base, connector=connector, headers=headers) as http:
        for qos in (0, 1):
            body = {"topic": "bench/gw", "payload": PAYLOAD, "qos": qos}

            async def one(n: int, body: dict[str, object] = body) -> bool:
                async with http.post("/api/v5/publish", json=body) as resp:
                    await resp.read()
                    return resp.status == 200

            await _run("warm-up", pids, 1.0, args.concurrency, one)
            name = f"HTTP QoS {qos}, {args.concurrency} in flight"
            rounds.append(await _run(name, pids, args.seconds, args.concurrency, one))
    return rounds


async def coap_rounds(
    base: str, password: str, pids: list[int], args: argparse.Namespace
) -> list[Round]:
    ctx = await aiocoap.Context.create_client_context()
    rounds = []
    try:
        for qos in (0, 1):
            uri = (
                f"{base}/ps/bench/gw?clientid=bench-coap&username={TENANT}/dev"
                f"&password={password}&qos={qos}"
            )

            async def one(n: int, uri: str = uri) -> bool:
                msg = aiocoap.Message(
                    code=aiocoap.POST,
                    uri=uri,
                    payload=PAYLOAD.encode(),
                    transport_tuning=aiocoap.Unreliable,
                )
                resp = await ctx.request(msg).response
                return resp.code == aiocoap.Code.CHANGED

            await _run("warm-up", pids, 1.0, args.concurrency, one)
            name = f"CoAP QoS {qos}, {args.concurrency} in flight"
            rounds.append(await _run(name, pids, args.seconds, args.concurrency, one))
    finally:
        await ctx.shutdown()
    return rounds


async def _prepare(launcher: Launcher) -> str:
    """A user (the CoAP client and the subscriber) and a tenant token (HTTP)."""
    mesh = launcher.mesh
    addr = f"127.0.0.1:{mesh.by_name('session').grpc_port}"
    admin = SessionAdminClient(addr, launcher.admin_token)
    tokens = TokenAdminClient(addr, launcher.admin_token)
    try:
        await admin.create_user(TENANT, "dev", "bench-pw", hash_scheme="bcrypt")
        _, token = await tokens.create(TENANT, 3600, "bench")
    finally:
        await admin.close()
        await tokens.close()
    return token


async def _subscribed(port: int) -> asyncio.Task[int]:
    """An MQTT subscriber of `bench/gw` counting what it gets (the count is its result)."""
    import aiomqtt

    ready = asyncio.Event()

    async def run() -> int:
        got = 0
        async with aiomqtt.Client(
            "127.0.0.1", port, username=f"{TENANT}/dev", password="bench-pw", identifier="sub"
        ) as client:
            await client.subscribe("bench/gw", qos=1)
            ready.set()
            async for _ in client.messages:
                got += 1
        return got

    task = asyncio.create_task(run())
    await asyncio.wait_for(ready.wait(), 30)
    return task


async def measure(launcher: Launcher, args: argparse.Namespace) -> list[Round]:
    token = await _prepare(launcher)
    gateway = launcher.mesh.by_name("gateway")
    others = [c.pid for c in launcher.mesh.components if c.pid and c.pid != gateway.pid]
    pids = [gateway.pid, *others]
    sub = await _subscribed(launcher.mesh.by_name("connection-0").port)
    try:
        base = f"http://127.0.0.1:{gateway.port}"
        rounds = await http_rounds(base, token, pids, args)
        coap = f"coap://127.0.0.1:{gateway.coap_port}"
        rounds += await coap_rounds(coap, "bench-pw", pids, args)
    finally:
        sub.cancel()
    return rounds


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args()
    print(f"calibration: 10M-step for loop {python_loop_seconds():.2f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        launcher = starling_launcher(Path(tmp) / "starling", nodes=1)
        launcher.start()
        try:
            rounds = asyncio.run(measure(launcher, args))
        finally:
            launcher.stop()
    for r in rounds:
        print(r.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
