"""Lingering close: how the node closes a client's socket so that the client reads the last
packet the node wrote (its DISCONNECT and reason code, a CONNACK refusal).

Theory of operation. Closing a TCP socket whose receive buffer still holds unread bytes makes
Linux answer with a RST and drop what it had not sent yet; a client busy writing then gets
"connection reset" on its next write, usually before it reads what came before, so it never
learns why it was closed or where to go (a drain's 0x9C and Server Reference, a takeover's
0x8E). So every server-side close (`Sink.close`, after the channel's last bytes were handed
to the transport) lingers:

1. the channel is CLOSED: whatever the client still sends is read and dropped (no MQTT);
2. plain TCP: the write side is shut (half-close) once the last bytes are flushed, so the
   client reads them, then end-of-file, and closes; TLS cannot half-close (a close_notify
   ends the session for both sides, and OpenSSL fails on data that follows it), so there the
   node waits for the client to close after reading its DISCONNECT;
3. the socket is closed once the client has closed its side: no unread input, no reset;
4. at `timeout_s` it is aborted all the same, so a client that neither reads nor closes
   holds nothing for long; and at most `max_sockets` linger at once (past that a close is
   immediate, as before), so a crowd of such clients holds a bounded number of sockets.

WebSockets do the same through aiohttp (listener.py): the close frame follows the MQTT
DISCONNECT, then frames are read and dropped until the client's close frame, at most
`timeout_s`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True)
class Linger:
    """The node's lingering sockets: how long each may linger, how many may at once, and how
    many do."""

    timeout_s: float = 2.0
    max_sockets: int = 10_000
    count: int = 0

    def begin(self) -> bool:
        """One more socket lingers; False (nothing counted) when `max_sockets` already do."""
        if self.count >= self.max_sockets:
            return False
        self.count += 1
        return True

    def end(self) -> None:
        self.count -= 1


class TcpSink:
    """The node's side of a TCP or TLS transport. Writes and read pausing go straight to the
    transport (bound methods kept as attributes: no extra call on the hot path); `close`
    lingers. The protocol calls `lost` when the transport is gone."""

    __slots__ = (
        "_linger",
        "_timer",
        "_transport",
        "pause_reading",
        "resume_reading",
        "write",
    )

    def __init__(self, transport: asyncio.Transport, linger: Linger) -> None:
        self._transport = transport
        self._linger = linger
        self._timer: asyncio.TimerHandle | None = None
        self.write = transport.write
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    @property
    def lingering(self) -> bool:
        return self._timer is not None

    def close(self) -> None:
        """Close once the client has read what was written and closed its side (module doc)."""
        t = self._transport
        if self._timer is not None or t.is_closing():
            return
        if not self._linger.begin():
            t.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self._linger.timeout_s, t.abort)
        if not t.is_reading():  # paused by flow control: the client's end-of-file must arrive
            t.resume_reading()
        if t.can_write_eof():
            t.write_eof()  # after the bytes still buffered

    def lost(self) -> None:
        """The transport closed (the client closed its side, or the timer aborted it)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._linger.end()
            self._timer = None  # the transport says is_closing() from now on
