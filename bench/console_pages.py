"""Console page times with 10,000 connected clients: `python -m bench.console_pages`.

Starts a mesh (bench/broker.py's settings), connects BENCH_CONSOLE_CLIENTS (10,000) clean
MQTT 3.1.1 clients over raw sockets (bench/loadgen.py), half on each node, and leaves
BENCH_CONSOLE_OFFLINE (1,000) persistent sessions offline; signs in to the console with the
operator token and fetches each page FETCHES times with an HTTP client (aiohttp), printing
one row per page: the median and the slowest fetch, in milliseconds, and the page's size.
The issue's bar is 300 ms per page. Numbers are measurements of this machine, never
assertions.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import loadgen
from bench.broker import BENCH_TENANT, starling_launcher
from bench.connects import _quiet
from bench.machine import open_files_to_hard_limit
from services.cli.launcher import Mesh

CLIENTS = int(os.environ.get("BENCH_CONSOLE_CLIENTS", "10000"))
OFFLINE = int(os.environ.get("BENCH_CONSOLE_OFFLINE", "1000"))
FETCHES = 5
BAR_MS = 300.0


async def _connect(mesh: Mesh) -> tuple[list[loadgen.Client], str]:
    """The clients, connected (half on each node), and one connected client's id."""
    nodes = [mesh.by_name("connection-0").port, mesh.by_name("connection-1").port]
    held: list[loadgen.Client] = []
    for i, port in enumerate(nodes):
        share = CLIENTS // len(nodes) + (CLIENTS % len(nodes) if i == 0 else 0)
        held += (await loadgen.connect_rate(port, share)).clients
    # Persistent sessions that went offline: the sessions page's rows.
    offline = await loadgen.connect_rate(nodes[0], OFFLINE, clean=False)
    for c in offline.clients:
        if c.transport is not None:
            c.transport.close()
    return held, held[len(held) // 2].name


async def _sign_in(http: aiohttp.ClientSession, base: str, token: str) -> None:
    form = await (await http.get(f"{base}/")).text()
    found = re.search(r'name="form_token" value="([^"]+)"', form)
    if found is None:
        raise RuntimeError("no sign-in form at /")
    async with http.post(
        f"{base}/", data={"token": token, "form_token": found.group(1)}, allow_redirects=False
    ) as resp:
        if resp.status != 303:
            raise RuntimeError(f"sign-in answered {resp.status}")


async def _time(http: aiohttp.ClientSession, url: str, must_show: str) -> tuple[list[float], int]:
    """FETCHES fetches of `url`: their times in ms and the page's size; the page must show
    `must_show` (a search that found nothing would time the wrong page)."""
    times, size = [], 0
    for _ in range(FETCHES):
        began = time.perf_counter()
        async with http.get(url, allow_redirects=False) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")
        times.append((time.perf_counter() - began) * 1000)
        size = len(body)
        if must_show.encode() not in body:
            raise RuntimeError(f"{url} does not show {must_show!r}")
    return times, size


def pages(client_id: str) -> list[tuple[str, str, str]]:
    """(row name, path, what the page must show)."""
    t = f"tenant={BENCH_TENANT}"
    row = f'data-client="{client_id}"'
    return [
        ("overview", "/overview", "Overview"),
        ("clients, page 1", f"/clients?{t}", "data-client="),
        ("clients, search", f"/clients?{t}&q={client_id}", row),
        ("a client", f"/clients/{client_id}?{t}", client_id),
        ("sessions", f"/sessions?{t}", "data-session="),
        ("topics", f"/topics?{t}", "Topics"),
        ("rules", f"/rules?{t}", "Rules"),
        ("access", f"/access?{t}", "Access"),
        ("ACL and quotas", f"/policy?{t}", "ACL"),
        ("audit", f"/audit?{t}", "Audit"),
    ]


async def measure(mesh: Mesh, token: str) -> list[str]:
    held, client_id = await _connect(mesh)
    # Let the mesh finish what the connects left (the offline sessions' releases) first.
    await asyncio.to_thread(_quiet, {c.name: c.pid for c in mesh.components if c.pid})
    rows = [
        f"{len(held):,} clients connected, {OFFLINE:,} persistent sessions offline; "
        f"{FETCHES} fetches per page",
        "",
        "| page | median ms | max ms | bytes | under 300 ms |",
        "|---|---:|---:|---:|---|",
    ]
    base = f"http://127.0.0.1:{mesh.by_name('console').port}"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            await _sign_in(http, base, token)
            for name, path, must_show in pages(client_id):
                times, size = await _time(http, base + path, must_show)
                slowest = max(times)
                ok = "yes" if slowest < BAR_MS else "no"
                row = (
                    f"| {name} | {statistics.median(times):.0f} | {slowest:.0f} | {size:,} | {ok} |"
                )
                rows.append(row)
    finally:
        for c in held:
            if c.transport is not None:
                c.transport.close()
    return rows


def main() -> int:
    import uvloop

    open_files_to_hard_limit()
    with tempfile.TemporaryDirectory() as tmp:
        launcher = starling_launcher(Path(tmp) / "mesh")
        mesh = launcher.start()
        try:
            rows = uvloop.run(measure(mesh, launcher.secrets.admin_token))
        finally:
            launcher.stop()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
