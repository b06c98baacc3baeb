"""The client's subscriptions and its SUBSCRIBE/UNSUBSCRIBE.

SUBSCRIBE is checked here (filter rules, $share rules, ACL) and becomes a `SubscribeRequest`;
the SUBACK waits for `subscribed`, which the node calls once the mesh subscriptions are in
place, so a publish that follows the SUBACK is never missed. UNSUBSCRIBE is answered at once.

Invariant: `len(filters) + _reserved` bounds what the client holds once every SUBSCRIBE in
flight is answered; a new filter is granted only while that stays within
`max_subscriptions_per_client` (beyond: 0x97, 3.1.1 0x80), so a client firing SUBSCRIBEs
without waiting for their SUBACKs cannot overshoot. Filters the node has not taken count
until their SUBACK. The tenant's quota (`starling quota set --max-subscriptions-per-client`)
lowers that cap for its clients; it is read at each SUBSCRIBE, so a change applies to
connected clients too (filters already held are kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from services.common.acl import AclChecker
from services.common.connect import IdentifiedSubscription
from services.common.mqtt.errors import MqttError, ProtocolViolationError
from services.common.mqtt.packets import SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe
from services.common.mqtt.reason import ReasonCode as RC
from services.common.topics import parse_shared, validate_topic_filter
from services.connection.channel.actions import SubscribeRequest, Unsubscribed
from services.connection.channel.config import ChannelConfig
from services.connection.channel.problems import Problems, describe

_V3_FAILURE = 0x80  # the one SUBACK failure code of 3.1.1


class SubscriptionQuota(Protocol):
    """The tenant's limits as the node last heard them (services/common/limits_copies.py)."""

    @property
    def max_subscriptions_per_client(self) -> int: ...  # 0: none


class ClientSubscriptions:
    """`filters` maps each subscribed filter to its Subscription Identifier (None: none).
    Call `start` once the session is known."""

    __slots__ = (
        "_acl",
        "_level",
        "_limits",
        "_max_subscriptions",
        "_on_limit",
        "_out",
        "_problems",
        "_quota",
        "_reserved",
        "filters",
    )

    def __init__(
        self,
        config: ChannelConfig,
        out: bytearray,
        acl: AclChecker,
        problems: Problems,
        on_limit: Callable[[str], None],
    ) -> None:
        self._limits = config.topic_limits
        self._max_subscriptions = config.max_subscriptions_per_client
        self._on_limit = on_limit
        self._out = out
        self._problems = problems
        self._level = 4
        self._acl = acl
        self._reserved = 0  # new filters granted in SUBSCRIBEs not answered yet
        self._quota: SubscriptionQuota | None = None
        self.filters: dict[str, int | None] = {}

    def start(
        self,
        level: int,
        acl: AclChecker,
        resumed: tuple[IdentifiedSubscription, ...],
        quota: SubscriptionQuota | None = None,
    ) -> None:
        """The client's protocol level and ACL, the subscriptions of a resumed session, and
        its tenant's quota (None: none)."""
        self._level = level
        self._acl = acl
        self._quota = quota
        for sub, sub_id in resumed:
            self.filters[sub.filter] = sub_id

    def on_subscribe(self, p: Subscribe) -> SubscribeRequest:
        """What the node should add; refused filters only get their SUBACK reason code.
        Raises `MqttError` when the client broke a rule."""
        ids = p.properties.subscription_identifier
        sub_id = ids[0] if ids else None
        codes: list[int] = []
        accepted: list[IdentifiedSubscription] = []
        new: set[str] = set()  # filters of this packet the client does not hold yet
        cap, label = self._cap()
        room = cap - len(self.filters) - self._reserved
        for s in p.subscriptions:
            code = self._grant(s)
            if code < 0x80 and s.filter not in self.filters and s.filter not in new:
                if len(new) >= room:
                    self._on_limit(label)
                    code = RC.QUOTA_EXCEEDED if self._level == 5 else _V3_FAILURE
                else:
                    new.add(s.filter)
            codes.append(code)
            if code < 0x80:
                accepted.append((s, sub_id))
        fresh = tuple(s.filter not in self.filters for s, _ in accepted)
        self._reserved += len(new)
        return SubscribeRequest(p.packet_id, tuple(accepted), tuple(codes), fresh, len(new))

    def _cap(self) -> tuple[int, str]:
        """Subscriptions the client may hold, and the refusal label of that cap: the node's
        setting, or the tenant's quota where that is lower."""
        cap = self._max_subscriptions
        if self._quota is not None:
            q = self._quota.max_subscriptions_per_client
            if q and q < cap:
                return q, "subscriptions_per_client"
        return cap, "max_subscriptions_per_client"

    def subscribed(self, request: SubscribeRequest) -> None:
        """The node has the subscriptions in place: record them and answer with SUBACK."""
        self._reserved -= request.reserved
        for s, sub_id in request.subscriptions:
            self.filters[s.filter] = sub_id
        suback = SubAck(request.packet_id, request.reason_codes)
        self._out += self._problems.encode(suback, _explain(request))

    def auto(self, subs: Sequence[tuple[str, int]]) -> SubscribeRequest | None:
        """The tenant's auto-subscriptions, rendered for this client: each one the client does
        not hold yet, that is valid and that its ACL allows, within its subscription limit,
        is recorded as its own at once (it may UNSUBSCRIBE it). No SUBACK. None: none is new."""
        accepted: list[IdentifiedSubscription] = []
        cap, label = self._cap()
        for f, qos in subs:
            if f in self.filters:
                continue  # e.g. a resumed session's, restored already
            if len(self.filters) + self._reserved >= cap:
                self._on_limit(label)
                break
            s = Subscription(f, qos)
            if self._grant(s) >= 0x80:
                continue
            self.filters[f] = None
            accepted.append((s, None))
        if not accepted:
            return None
        n = len(accepted)
        return SubscribeRequest(0, tuple(accepted), tuple(s.qos for s, _ in accepted), (True,) * n)

    def on_unsubscribe(self, p: Unsubscribe) -> Unsubscribed:
        """Forget the filters and answer with UNSUBACK; the node drops them from the mesh.
        An invalid filter (one no client can hold) gets 0x8F and never reaches the node."""
        codes = []
        valid: list[str] = []
        for f in p.filters:
            if self.filters.pop(f, _NO_SUB) is not _NO_SUB:
                codes.append(0)
            elif not self._valid(f):
                codes.append(RC.TOPIC_FILTER_INVALID)
                continue
            else:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
            valid.append(f)
        level = self._level
        unsuback = UnsubAck(p.packet_id, tuple(codes) if level == 5 else ())
        missing = [
            f for f, c in zip(p.filters, codes, strict=True) if c == RC.NO_SUBSCRIPTION_EXISTED
        ]
        text = f"no subscription existed for {', '.join(missing)}" if missing else ""
        self._out += self._problems.encode(unsuback, text)
        return Unsubscribed(tuple(valid))

    def _valid(self, filt: str) -> bool:
        """`filt` is a filter a client could hold (plain or shared, within our limits)."""
        try:
            if parse_shared(filt, self._limits) is None:
                validate_topic_filter(filt, self._limits)
        except MqttError as exc:
            if exc.limit:
                self._on_limit(exc.limit)
            return False
        return True

    def _grant(self, s: Subscription) -> int:
        """The SUBACK reason code for one filter: the granted QoS, or >= 0x80 refused."""
        v5 = self._level == 5
        try:
            shared = parse_shared(s.filter, self._limits)
            if shared is None:
                validate_topic_filter(s.filter, self._limits)
        except MqttError as exc:
            if exc.limit:
                self._on_limit(exc.limit)
            return RC.TOPIC_FILTER_INVALID if v5 else _V3_FAILURE
        if shared is not None and s.no_local:
            raise ProtocolViolationError("no local on a shared subscription")  # [MQTT-3.8.3-4]
        if not self._acl.can_subscribe(shared.filter if shared else s.filter):
            return RC.NOT_AUTHORIZED if v5 else _V3_FAILURE
        return s.qos


_NO_SUB = object()


def _explain(request: SubscribeRequest) -> str:
    """The Reason String of a SUBACK that refuses filters ("" when it refuses none). The
    refused filters are not in the request (only their codes are), so it names the codes."""
    refused = sorted({c for c in request.reason_codes if c >= 0x80})
    if not refused:
        return ""
    n = sum(c >= 0x80 for c in request.reason_codes)
    return f"{n} of {len(request.reason_codes)} filters refused: " + ", ".join(
        describe(c) for c in refused
    )
