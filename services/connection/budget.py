"""The per-publish and per-delivery checks of a connection against its node's share of tenant
(and user) rate limits: `PublishGate` and `DeliveryGate`, over the `Bucket`s of bucket.py.

Pure bookkeeping, no I/O (the leases that fill the buckets are services/connection/quota.py's).
Deliveries to subscribers draw on "bytes_out_per_s" buckets through a `DeliveryGate`: a
delivery goes while every budget has a positive balance and is charged in full, so the debt
is at most one message (a message larger than a lease slice still goes); a connection the
gate stops waits on the bucket (`waiters`) and is woken by the next lease's answer. Before
the first answer only one delivery goes (see `Bucket.open`).
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.message import Message
from services.common.message_size import message_bytes
from services.connection.bucket import LIMITED, UNKNOWN, UNLIMITED, Bucket
from services.connection.channel.hooks import DeliveryHooks
from services.connection.channel.subscriptions import SubscriptionQuota

__all__ = ["LIMITED", "UNKNOWN", "UNLIMITED", "Bucket", "DeliveryGate", "PublishGate"]

_PLENTY = 1 << 62  # the allowance of unlimited budgets
# PublishGate._batch: outside a batch; before its first publish; after it (the next takes
# note of an allowance); no allowance to be had in this batch (each publish is checked).
_OUTSIDE, _FIRST, _MORE, _EACH = 0, 1, 2, 3


class PublishGate:
    """The budgets one connection's publishes draw on (its tenant's and its user's, those
    that are limited or not known yet), checked together: a publish takes from all of them
    or from none.

    Per batch, not per publish: the channel brackets the publishes of one socket read with
    `begin`/`end`. Within it, the first publish is checked against the buckets alone (many
    reads carry one); the second finds every budget unlimited or with tokens to spare in a
    live window (the common case) and takes note of what is spare, the allowance (each
    budget's tokens above its low-water mark); it and the publishes after it only count
    the allowance down, and `end` charges the buckets what was used. Nothing
    else runs between `begin` and `end` (no await), so no other connection sees the buckets
    meanwhile, and the allowance never outlives the read (a window's end, a limit change).
    Anything else (a budget running low, not known yet, a window over) and every publish
    outside a batch is checked against the buckets one by one, as before."""

    __slots__ = (
        "_b",
        "_b0",
        "_batch",
        "_buckets",
        "_charge",
        "_clock",
        "_flat",
        "_msgs",
        "_n",
        "_n0",
        "_on_refused",
        "_size",
        "delivery",
        "limits",
        "tenant",
    )

    def __init__(
        self,
        *,
        tenant: str,
        buckets: tuple[tuple[Bucket, Bucket], ...],
        clock: Callable[[], float],
        on_refused: Callable[[str, str], None],
        limits: SubscriptionQuota | None = None,
        delivery: DeliveryGate | None = None,
    ) -> None:
        self.tenant = tenant
        self.delivery = delivery  # the connection's outbound budgets, same scopes
        # The tenant's count limits as the node last heard them (updated in place).
        self.limits = limits
        self._buckets = buckets  # (messages, bytes) per scope
        self._flat = tuple(b for pair in buckets for b in pair)
        # A connection without a user name draws on its tenant's budgets alone (the usual
        # case): that pair is taken note of without a loop.
        self._msgs: Bucket | None = buckets[0][0] if len(buckets) == 1 else None
        self._size: Bucket | None = buckets[0][1] if len(buckets) == 1 else None
        self._clock = clock
        self._on_refused = on_refused
        self._batch = _OUTSIDE  # where begin()/end() are, and the allowance's state
        # The allowance: publishes and bytes left (_n, _b) of what was taken note of
        # (_n0, _b0); 0 when none. `_charge`: some budget of it is limited (to be charged).
        self._n = self._n0 = self._b = self._b0 = 0
        self._charge = False

    def begin(self) -> None:
        """A batch of publishes (one read from the socket) starts."""
        self._batch = _FIRST

    def end(self) -> None:
        """The batch is over: the buckets are charged what its publishes used."""
        if self._n0:
            self._settle()
        self._batch = _OUTSIDE

    def admit(self, nbytes: int) -> bool:
        """One publish of `nbytes` (payload and topic): True if within every budget (and
        taken from them); False counts a refusal of the budget that ran out."""
        left = self._b - nbytes
        if left >= 0 and self._n > 0:  # within the batch's allowance: count it down
            self._b = left
            self._n -= 1
            return True
        if self._n0:  # the allowance is used up: charge it, then look at the buckets
            self._settle()
        batch = self._batch
        if batch == _MORE:
            if self._take(nbytes):
                return True
            self._batch = _EACH
        elif batch == _FIRST:
            # A read's first publish is checked alone: many reads carry just one, and
            # taking note of an allowance costs about what checking one publish does.
            self._batch = _MORE
        return self._admit(nbytes)

    def _take(self, nbytes: int) -> bool:
        """Take note of the allowance if every budget is unlimited or limited with more
        than this publish to spare in a live window; count this publish from it."""
        msgs, size = self._msgs, self._size
        if msgs is None or size is None:
            n, b = self._allowance()
        else:
            ms, ss = msgs.state, size.state
            if ms == LIMITED and ss == LIMITED:  # a limited tenant: no loop
                now = self._clock()
                if now >= msgs.expires or now >= size.expires:
                    return False
                n, b = msgs.tokens - msgs.low, size.tokens - size.low
                self._charge = True
            else:
                n, b = self._allowance()
        if n < 1 or b < nbytes:
            return False
        self._n0, self._b0 = n, b
        self._n, self._b = n - 1, b - nbytes
        return True

    def _allowance(self) -> tuple[int, int]:
        """`_take` for a tenant and a user: what is spare in all four budgets (0: none)."""
        for bucket in self._flat:  # most tenants have no limits: no clock, nothing to charge
            if bucket.state != UNLIMITED:
                break
        else:
            self._charge = False
            return _PLENTY, _PLENTY
        now = self._clock()
        n = b = _PLENTY
        for msgs, size in self._buckets:
            state = msgs.state
            if state == LIMITED and now < msgs.expires:
                spare = msgs.tokens - msgs.low
                if spare < n:
                    n = spare
            elif state != UNLIMITED:
                return 0, 0
            state = size.state
            if state == LIMITED and now < size.expires:
                spare = size.tokens - size.low
                if spare < b:
                    b = spare
            elif state != UNLIMITED:
                return 0, 0
        self._charge = n != _PLENTY or b != _PLENTY
        return n, b

    def _settle(self) -> None:
        """Charge the buckets the allowance used (tokens and demand) and forget the rest."""
        n, b = self._n0 - self._n, self._b0 - self._b
        self._n = self._n0 = self._b = self._b0 = 0
        if self._charge:
            _charge(self._buckets, n, b, True)

    def _admit(self, nbytes: int) -> bool:
        """One publish checked against the buckets (and taken from them)."""
        msgs, size = self._msgs, self._size
        if msgs is not None and size is not None:  # a tenant alone: the common cases inline
            ms, ss = msgs.state, size.state
            if ms == UNLIMITED and ss == UNLIMITED:
                return True
            if ms == LIMITED and ss == LIMITED:
                now = self._clock()
                if (
                    msgs.tokens > msgs.low
                    and size.tokens - nbytes >= size.low
                    and now < msgs.expires
                    and now < size.expires
                ):
                    _charge(self._buckets, 1, nbytes, True)
                    return True
        else:
            for b in self._flat:  # most tenants have no limits: a few reads, no call
                if b.state != UNLIMITED:
                    break
            else:
                return True
        now = self._clock()
        # The common case, Bucket.has inlined for every budget at once: each limited budget
        # keeps tokens to spare above its low-water mark in a live window, so nothing needs
        # asking for and everything is taken.
        for msgs, size in self._buckets:
            state = msgs.state
            if state != UNLIMITED and not (
                state == LIMITED and msgs.tokens > msgs.low and now < msgs.expires
            ):
                return self._check_each(nbytes, now)
            state = size.state
            if state != UNLIMITED and not (
                state == LIMITED and size.tokens - nbytes >= size.low and now < size.expires
            ):
                return self._check_each(nbytes, now)
        _charge(self._buckets, 1, nbytes, True)
        return True

    def _check_each(self, nbytes: int, now: float) -> bool:
        for msgs, size in self._buckets:
            if not msgs.has(1, now):
                msgs.refused += 1
                self._on_refused(msgs.key[2], self.tenant)
                return False
            if not size.has(nbytes, now):
                size.refused += 1
                self._on_refused(size.key[2], self.tenant)
                return False
        _charge(self._buckets, 1, nbytes, False)  # Bucket.has counted the demand
        return True


class DeliveryGate:
    """The outbound bandwidth budgets one connection's deliveries draw on (its tenant's and
    its user's "bytes_out_per_s"). `admit` is asked before each PUBLISH is written and
    charges it; when it says no, the gate waits on the budget that ran out and calls `wake`
    once a lease answered (the connection then retries what it holds).

    A connection consults the gate only while one of its budgets may limit (not known yet,
    or limited): `attach` is how the gate tells it (`refresh`, called at start and whenever
    a budget becomes or stops being unlimited), so a tenant without the limit costs its
    deliveries nothing."""

    __slots__ = (
        "__weakref__",
        "_buckets",
        "_clock",
        "_hooks",
        "_on_refused",
        "_wait",
        "tenant",
        "waiting",
    )

    def __init__(
        self,
        *,
        tenant: str,
        buckets: tuple[Bucket, ...],
        clock: Callable[[], float],
        on_refused: Callable[[str, str], None],
        wait: Callable[[Bucket], None],
        hooks: DeliveryHooks,
    ) -> None:
        self.tenant = tenant
        self._buckets = buckets
        self._clock = clock
        self._on_refused = on_refused
        self._wait = wait  # the bucket is out: make sure a lease will answer (and wake us)
        self._hooks = hooks
        self.waiting = False  # in a bucket's `waiters`
        for b in buckets:
            b.gates.add(self)

    def wake(self) -> None:
        """A lease answered while the gate waited: its connection retries what it holds."""
        self._hooks.wake()

    @property
    def needed(self) -> bool:
        """One of the budgets may limit: not known yet or limited."""
        return any(b.state != UNLIMITED for b in self._buckets)

    def refresh(self) -> None:
        """Attach the gate to its connection while it is needed, detach it otherwise."""
        self._hooks.attach(self if self.needed else None)

    def admit(self, msg: Message, qos0: bool = False) -> bool:
        """`msg` (payload and topic bytes) may be written now: True charges it. `qos0`: a
        QoS 0 delivery, dropped if refused, so a budget whose limit is not known yet (its
        first lease on its way, a few ms) lets it through on credit: every tenant's budget
        starts so on every node, and most tenants have no limit at all."""
        for b in self._buckets:  # most tenants have no limit: a few reads, no call
            if b.state != UNLIMITED:
                return self._admit(message_bytes(msg.topic, msg.payload), qos0)
        return True

    def open(self) -> bool:
        """Deliveries may go now (nothing charged): False waits for the next lease."""
        for b in self._buckets:
            if b.state != UNLIMITED:
                return self._admit(0)
        return True

    def _admit(self, nbytes: int, qos0: bool = False) -> bool:
        now = self._clock()
        for b in self._buckets:
            if qos0 and b.state == UNKNOWN:
                b.demand += nbytes
                if not b.asking:
                    b.want(b)
                continue
            if not b.open(nbytes, now):
                if not self.waiting:
                    self.waiting = True
                    b.waiters.append(self)
                    self._wait(b)
                return False
        for b in self._buckets:
            if b.state != UNLIMITED:
                b.tokens -= nbytes
        return True

    def refused(self) -> None:
        """A QoS 0 delivery was dropped for want of tokens: count it."""
        self._on_refused("bytes_out_per_s", self.tenant)
        for b in self._buckets:
            if b.state == LIMITED and b.tokens <= 0:
                b.refused += 1
                return


def _charge(pairs: tuple[tuple[Bucket, Bucket], ...], n: int, nbytes: int, demand: bool) -> None:
    """Take `n` publishes and `nbytes` from every limited budget of `pairs` ((messages, bytes)
    per scope); `demand`: count them as demand too (not counted yet). The one place a
    publish gate charges its buckets."""
    for msgs, size in pairs:
        if msgs.state == LIMITED:
            msgs.tokens -= n
            if demand:
                msgs.demand += n
        if size.state == LIMITED:
            size.tokens -= nbytes
            if demand:
                size.demand += nbytes
