"""One client connection as the node holds it: its channel, its transport and its links.

`Conn` is the thin shell around a sans-I/O `Channel`: bytes from the transport go into the
channel, the actions the channel returns go to the node (`Shell.carry_out`), and the bytes it
wants written are flushed in one batch per event-loop turn (`writes.WriteBatcher`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from services.common.clock import now_ms
from services.connection.channel import Action, Channel

if TYPE_CHECKING:
    from services.connection.exactly_once import ExactlyOnceInbound
    from services.connection.peer_cert import PeerCert
    from services.connection.persistence import PersistentDelivery


class Sink(Protocol):
    """The transport side of a connection (TCP/TLS transport or WebSocket writer)."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class Shell(Protocol):
    """What a connection needs from its node."""

    def carry_out(self, conn: Conn, actions: list[Action]) -> None: ...

    def mark_dirty(self, conn: Conn) -> None: ...

    def cleanup(self, conn: Conn) -> object: ...

    def sweep_at(self, conn: Conn, at: float) -> None: ...


class Conn:
    __slots__ = (
        "cert",
        "channel",
        "closed",
        "exactly_once",
        "opened_at",
        "persistent",
        "registered",
        "shell",
        "sink",
        "sweep_slot",
    )

    def __init__(
        self, shell: Shell, channel: Channel, sink: Sink, cert: PeerCert | None = None
    ) -> None:
        self.shell = shell
        self.channel = channel
        self.sink = sink
        self.closed = False
        # When this node took the connection (wall clock, whole milliseconds, as a mesh
        # message's publish time): a transient message published before it is not delivered
        # to it (fanout.py), so a late copy of one the client got on another node cannot
        # arrive here a second time.
        self.opened_at = now_ms() / 1000
        self.registered = False  # in the registry: CONNECT was accepted
        self.sweep_slot = 0  # when the sweeper looks at it next (sweeper.py; 0: not yet)
        self.persistent: PersistentDelivery | None = None  # the session outlives the connection
        self.cert = cert  # a verified client certificate (mTLS), if any
        # A persistent session's publishes, QoS 2 recorded with the session first.
        self.exactly_once: ExactlyOnceInbound | None = None

    def receive(self, data: bytes) -> None:
        ch = self.channel
        actions = ch.receive(data, time.time())
        if actions:
            self.shell.carry_out(self, actions)
        if ch.out and not self.closed:
            self.shell.mark_dirty(self)

    def flush(self) -> None:
        ch = self.channel
        out = ch.out
        if out:
            self.sink.write(bytes(out))
            ch.bytes_sent += len(out)
            out.clear()

    def writable(self, ok: bool) -> None:
        """The transport's write buffer went over its high-water mark (False) or drained
        (True): hold deliveries meanwhile, then move what waits into the window."""
        ch = self.channel
        now = time.time()
        ch.outbound.set_congested(not ok, now)
        if not ok:  # the sweeper closes it if this lasts too long
            self.shell.sweep_at(self, ch.next_check(now))
        if ok and not self.closed:
            if self.persistent is not None:
                self.persistent.pump()
            if ch.out:
                self.shell.mark_dirty(self)

    def resume_delivery(self) -> None:
        """The outbound bandwidth budget has tokens again: send what it held (its channel's
        `on_resume`, given by the node at the channel's construction)."""
        if self.closed:
            return
        ch = self.channel
        ch.outbound.resume(time.time())
        if self.persistent is not None:
            self.persistent.pump()
        if ch.out:
            self.shell.mark_dirty(self)

    def pause_reading(self) -> bool:
        """Stop reading from the transport (TCP pushes back on the client); False if the
        transport cannot."""
        pause = getattr(self.sink, "pause_reading", None)
        if pause is None:
            return False
        pause()
        return True

    def resume_reading(self) -> None:
        resume = getattr(self.sink, "resume_reading", None)
        if resume is not None and not self.closed:
            resume()

    def lost(self) -> None:
        """The transport closed (either side)."""
        self.channel.connection_lost()
        self.shell.cleanup(self)
