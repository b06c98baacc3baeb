"""`flushed(nc)`: what this NATS connection sent so far has reached the server, and taken
effect there, when it returns.

nats-py's own `flush()` does not promise that: it writes its PING straight to the socket,
while the commands sent just before it (a SUB, a PUB) still wait in the client's buffer for
its flusher task. nats-server's trace shows the PING arriving ahead of a SUB made just
before it, so the PONG can come back while the server has not seen the SUB yet: a SUBACK
answered then, or a message another connection publishes after it, can miss the new
subscription. `flushed` first waits until the flusher task has written what was buffered,
then sends the PING, whose PONG now comes after them. tests/common/test_bus_flushing.py
reads the order off nats-server's trace.
"""

from __future__ import annotations

import asyncio
import math

from nats.aio.client import Client


async def flushed(nc: Client, timeout_s: float = 5.0) -> None:
    """Every command sent on `nc` before this call is at the server and applied (its
    subscriptions in place, its publishes routed); nats' TimeoutError when the server does
    not answer within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    # nats-py's flusher hand-off (the method its own publish and subscribe call): it
    # returns once the buffered commands are written. Pinned in requirements.lock; without
    # it, a first PING round trip lets the flusher task run before the second PING.
    write_buffered = getattr(nc, "_flush_pending", None)
    if write_buffered is not None:
        try:
            await asyncio.wait_for(write_buffered(force_flush=True), timeout_s)
        except TimeoutError:
            pass  # the PING below times out the same way, with nats' own error
    else:
        await nc.flush(timeout=_left(deadline, loop))
    await nc.flush(timeout=_left(deadline, loop))


def _left(deadline: float, loop: asyncio.AbstractEventLoop) -> int:
    # nats-py takes whole seconds (at least one).
    return max(1, math.ceil(deadline - loop.time()))
