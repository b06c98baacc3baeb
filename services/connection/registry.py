"""The node's connections: every open one, the accepted ones by (tenant, client id, epoch),
and tombstones of kicks that arrived while a connection was still authenticating.

Invariant: a client id of a tenant maps to at most the connections of this node that the
session service accepted; a kick (takeover or admin) names an epoch, and every connection of
that client with an epoch at or below it is closed. A kick that arrives before the CONNECT
answer leaves a tombstone, so the answer is refused instead of resurrecting the session.
"""

from __future__ import annotations

from services.connection.conn import Conn

ClientKey = tuple[str, str]  # (tenant, client id)
TOMBSTONE_TTL_S = 60.0


class Registry:
    def __init__(self) -> None:
        self.conns: set[Conn] = set()
        self._clients: dict[ClientKey, dict[int, Conn]] = {}
        self._tombstones: dict[ClientKey, tuple[int, float]] = {}  # key -> (epoch, at)
        # key -> (epoch, Session Expiry its DISCONNECT set or None, at): connections that
        # ended recently, for a CONNECT that displaces one before its release arrived.
        self._ended: dict[ClientKey, tuple[int, int | None, float]] = {}

    def __len__(self) -> int:
        return len(self.conns)

    def opened(self, conn: Conn) -> None:
        self.conns.add(conn)

    def accepted(self, conn: Conn) -> None:
        ch = conn.channel
        conn.registered = True
        self._clients.setdefault((ch.tenant, ch.client_id), {})[ch.epoch] = conn

    def closed(self, conn: Conn, now: float) -> None:
        self.conns.discard(conn)
        if not conn.registered:
            return
        ch = conn.channel
        key = (ch.tenant, ch.client_id)
        prev = self._ended.get(key)
        if prev is None or prev[0] < ch.epoch:
            self._ended[key] = (ch.epoch, ch.disconnect_expiry_s, now)
        held = self._clients.get(key)
        if held is not None:
            held.pop(ch.epoch, None)
            if not held:
                del self._clients[key]

    def held(self) -> list[Conn]:
        """Every accepted connection still open: what this node re-asserts when the session
        registry was lost."""
        return [c for held in self._clients.values() for c in held.values() if not c.closed]

    def knows(self, key: ClientKey, epoch: int) -> bool:
        """Whether this process has the connection of this epoch, or had it recently."""
        if epoch in self._clients.get(key, {}):
            return True
        rec = self._ended.get(key)
        return rec is not None and rec[0] == epoch

    def superseded(self, key: ClientKey, epoch: int) -> bool:
        """A kick for this epoch (or a later one) arrived before its CONNECT answer."""
        tomb = self._tombstones.get(key)
        return tomb is not None and tomb[0] >= epoch

    def kick(self, key: ClientKey, epoch: int, now: float) -> list[Conn]:
        """Record the kick; return the connections it closes (epoch 0: all of them)."""
        prev = self._tombstones.get(key)
        if prev is None or prev[0] < epoch:
            self._tombstones[key] = (epoch, now)
        held = self._clients.get(key, {})
        return [c for e, c in list(held.items()) if epoch == 0 or e <= epoch]

    def ended(self, key: ClientKey, epoch: int) -> tuple[bool, int | None]:
        """Whether the connection of this epoch already ended here, and the Session Expiry
        its DISCONNECT set (None: it set none)."""
        if epoch in self._clients.get(key, {}):
            return False, None
        rec = self._ended.get(key)
        if rec is None or rec[0] != epoch:
            return False, None
        return True, rec[1]

    def expire_tombstones(self, now: float) -> None:
        cutoff = now - TOMBSTONE_TTL_S
        for key in [k for k, (_, at) in self._tombstones.items() if at < cutoff]:
            del self._tombstones[key]
        for key in [k for k, (_, _, at) in self._ended.items() if at < cutoff]:
            del self._ended[key]
