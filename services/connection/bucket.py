"""One budget of a node's share of a rate limit: `Bucket`, pure bookkeeping, no I/O.

A bucket is one budget of one scope ("messages_per_s" or "bytes_in_per_s" of a tenant, or of
one user of a tenant; "bytes_out_per_s" for deliveries). Its tokens are what the quota
service granted this node for the current one-second window; they expire with the window
(`expires`), so the grants of every node together never exceed the limit in any window.
- a bucket whose limit is not known yet (no answer so far) admits everything and asks: the
  first publishes of a tenant are never held up by a round trip. One whose limit is 0
  (unlimited) admits everything and asks nothing until the limits change.
- a bucket below its low-water mark (or empty) marks itself `wanted`; the lease loop
  (services/connection/quota.py) tops up the wanted ones, sized by recent demand. The
  publish path never waits for it.
The gates that check a publish or a delivery against a connection's buckets are budget.py's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.connection.budget import DeliveryGate

UNKNOWN, UNLIMITED, LIMITED = 0, 1, 2


class Bucket:
    __slots__ = (
        "answered",
        "asking",
        "demand",
        "expires",
        "fallback",
        "gates",
        "granted_window",
        "keep_rate",
        "key",
        "limit",
        "low",
        "not_before",
        "refused",
        "renew_at",
        "share",
        "state",
        "tokens",
        "waiters",
        "want",
    )

    def __init__(self, key: tuple[str, str, str], want: Callable[[Bucket], None]) -> None:
        self.key = key  # (tenant, user or "", resource)
        self.state = UNKNOWN
        # The quota service answered for this budget since its limits last changed: its
        # state says what the limit is (a self-granted budget's LIMITED does not).
        self.answered = False
        self.limit = 0
        self.low = 1  # ask for more below this many tokens (low_water(), kept current)
        self.tokens = 0
        self.expires = 0.0  # monotonic time the tokens lapse (end of their window)
        self.demand = 0  # units asked for (admitted or not) since the last lease
        self.refused = 0  # publishes refused for want of tokens (counted, per bucket)
        self.asking = False  # a lease request is under way
        self.not_before = 0.0  # no request before this (the window's budget is spent)
        self.granted_window = 0  # granted in the current window (what "keep" reuses)
        self.keep_rate = 0  # the last full window's grants: the share kept if quota is down
        # The most "keep" grants itself per second: the limit divided by the nodes the
        # quota service last counted for this budget (so all nodes' self-grants fit in it).
        self.share = 0
        # Tokens the node granted itself (quota service unreachable): ask again at renew_at.
        self.fallback = False
        self.renew_at = 0.0
        self.want = want
        # Delivery gates stopped for want of tokens, woken when a lease answers.
        self.waiters: list[DeliveryGate] = []
        # The delivery gates drawing on this (bytes-out) budget: told when it becomes or
        # stops being unlimited, so a connection checks it only while it may limit. Weak:
        # a closed connection's gate goes with it.
        self.gates: weakref.WeakSet[DeliveryGate] = weakref.WeakSet()

    def reset(self) -> None:
        """The limits changed: forget what was known; the next use asks again."""
        self.state = UNKNOWN
        self.answered = False
        self.tokens = 0
        self.not_before = 0.0
        self.fallback = False

    def has(self, n: int, now: float) -> bool:
        """`n` units could be taken now (asks for more when running low)."""
        state = self.state
        if state == UNLIMITED:
            return True
        self.demand += n
        # The common case, in as few steps as possible: tokens to spare in a live window.
        if state == LIMITED and self.tokens - n >= self.low and now < self.expires:
            return True
        return self._check(n, now)

    def _check(self, n: int, now: float) -> bool:
        if self.state == UNKNOWN:
            # Asked at once; while the quota service cannot answer, once per retry period.
            if not self.asking and now >= self.not_before:
                self.want(self)
            return True
        if now >= self.expires and self.tokens > 0:
            self.tokens = 0  # the window's tokens lapse (a debt stays, see below)
        tokens = self.tokens
        spent = now < self.not_before  # this window's budget is used up cluster-wide
        if (
            not self.asking
            and not spent
            and (tokens - n < self.low or (self.fallback and now >= self.renew_at))
        ):
            self.want(self)
        if tokens >= n:
            return True
        # Out of tokens while a lease is on its way (every new one-second window starts so):
        # go on credit, at most `low` units, paid back from that lease. Refusing instead
        # dropped every publish at each window's start, even far below the limit.
        return self.asking and not spent and tokens - n >= -self.low

    def open(self, n: int, now: float) -> bool:
        """A delivery of `n` units may go now: the balance is positive (or, while a lease is
        on its way, the debt is within `low`); the caller then charges all `n`. Unlike
        `has`, a message larger than the balance goes: it is written or held whole, and
        holding one larger than every grant would stop its connection for good."""
        if self.state == UNLIMITED:
            return True
        self.demand += n
        if self.state == LIMITED and self.tokens - n >= self.low and now < self.expires:
            return True
        if self.state == UNKNOWN:
            # One delivery goes (charged: the first lease's grant pays it back), then the
            # rest wait for the answer (a few ms): admitting all meanwhile would let a
            # persistent session's whole first read batch through on every node it lands on.
            if not self.asking and now >= self.not_before:
                self.want(self)
            # Unanswered because the service is away (`fallback`): nothing known to hold.
            return self.fallback or self.tokens >= 0
        if now >= self.expires and self.tokens > 0:
            self.tokens = 0
        tokens = self.tokens
        spent = now < self.not_before
        if (
            not self.asking
            and not spent
            and (tokens - n < self.low or (self.fallback and now >= self.renew_at))
        ):
            self.want(self)
        if tokens > 0:
            return True
        return self.asking and not spent and tokens > -self.low

    def set_limit(self, limit: int, asked: int = 0) -> None:
        """The limit a lease answered with; `asked`: what that lease asked for (0: unknown)."""
        self.limit = limit
        self.low = self.low_water(asked)

    def low_water(self, asked: int = 0) -> int:
        """Ask for more below half a slice, or below half of what the last lease asked for
        when that was less (demand far below the limit): one lease then brings the bucket
        above its mark, so a window starts with one ask, not several."""
        half = self.slice_size() // 2
        if asked:
            half = min(half, asked // 2)
        return max(1, half)

    def slice_size(self, slices: int = 10) -> int:
        """The most one request asks for: a tenth of the limit, so that nodes that all want
        more share a window rather than the first one taking it all."""
        return max(1, self.limit // slices)

    def ask_size(self, slices: int) -> int:
        """What to ask for: the recent demand, within a quarter to a whole slice."""
        cap = self.slice_size(slices)
        return min(cap, max(max(1, cap // 4), self.demand))
