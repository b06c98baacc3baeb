"""How a channel opens: the client's CONNECT (and the AUTH packets of enhanced
authentication) yields `Authenticate`; the session service's answer (`authenticated`) writes
the CONNACK and replays the packets held meanwhile, in order.

When the tenant's auto-subscriptions give the client any (`authenticated(..., auto=...)`),
it returns `AutoSubscribe` instead and the channel is ACCEPTED: the CONNACK and the held
packets wait for `auto_subscribed`, so the client gets its CONNACK once they are in place, as
a resumed session's subscriptions are. With enhanced authentication (MQTT 5 AUTH,
enhanced_auth.py) `authenticated` may instead write AUTH 0x18; the client's AUTH answer
yields the next `Authenticate`. A connected client's AUTH 0x19 yields `Reauthenticate`,
answered by `reauthenticated`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from services.common.acl import AclChecker
from services.common.connect import ConnectOutcome
from services.common.mqtt.encoder import encode
from services.common.mqtt.errors import MqttError
from services.common.mqtt.packets import Auth, Connect, Packet
from services.common.mqtt.reason import ReasonCode as RC
from services.connection.channel.actions import Action, Authenticate, AutoSubscribe
from services.connection.channel.closing import ChannelClosing
from services.connection.channel.control import enforced_keepalive
from services.connection.channel.hooks import DeliveryHooks
from services.connection.channel.state import State

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.budget import DeliveryGate


class ChannelOpening(ChannelClosing):
    """The opening half of `Channel` (core.py)."""

    __slots__ = ()

    def _handle_all(
        self,
        packets: Iterable[Packet],
        now: float,
        actions: list[Action],
        broken: MqttError | None = None,
    ) -> None:
        raise NotImplementedError  # core.py's Channel: the held packets replay through it

    def authenticated(
        self, outcome: ConnectOutcome, now: float, auto: Sequence[tuple[str, int]] = ()
    ) -> list[Action]:
        """The session service's answer to `Authenticate`: CONNACK, then the held packets.
        `auto`: the tenant's auto-subscriptions (filter, QoS) rendered for this client by the
        node; those it takes (not held yet, valid, allowed by its ACL, within its limit) are
        recorded as its own and returned in `AutoSubscribe`, and the CONNACK waits for
        `auto_subscribed`."""
        actions: list[Action] = []
        if self.state is not State.AUTHENTICATING:
            return actions
        if outcome.auth_continue and self._auth.method is not None:
            self.out += self._auth.challenge(outcome.auth_data, outcome.auth_state, now)
            return actions
        if not outcome.ok:
            self.will = None  # a refused connection leaves no will
            actions.append(self._refuse(outcome.reason_code, outcome.reason_string))
            return actions
        connack = self._accept(outcome, now)
        if len(connack) > self.outbound.max_packet_size:
            # [MQTT-3.1.2-24] Not even the CONNACK fits the client's Maximum Packet Size: it
            # is not sent, and the connection closes (without a will: nothing went wrong).
            self.will = None
            actions.append(
                self._close(RC.PACKET_TOO_LARGE, "the CONNACK exceeds the client's maximum")
            )
            return actions
        request = self._subscriptions.auto(auto) if auto else None
        if request is not None:
            self.state = State.ACCEPTED
            self._handshake.hold_connack(connack, now)
            actions.append(AutoSubscribe(request))
            return actions
        self.out += connack
        self._handle_all(self._handshake.release_held(), now, actions)
        return actions

    def auto_subscribed(self, ok: bool, now: float) -> list[Action]:
        """The node carried out `AutoSubscribe`: the CONNACK goes, then the held packets. Not
        `ok` (the node could not put them in place) refuses the CONNECT with 0x88 Server
        unavailable: the client retries, rather than run without subscriptions its tenant
        gives every client."""
        actions: list[Action] = []
        if self.state is not State.ACCEPTED:
            return actions
        if not ok:
            self.will = None  # a refused connection leaves no will
            actions.append(self._refuse(RC.SERVER_UNAVAILABLE))
            return actions
        self._release_connack()
        self._handle_all(self._handshake.release_held(), now, actions)
        return actions

    def reauthenticated(self, outcome: ConnectOutcome, now: float) -> list[Action]:
        """The session service's answer to `Reauthenticate`: AUTH 0x18 to go on, AUTH 0x00
        when done, or DISCONNECT with the refusal's reason code."""
        if self.state is not State.CONNECTED:
            return []
        if outcome.auth_continue:
            self.out += self._auth.challenge(outcome.auth_data, outcome.auth_state, now)
            return []
        if not outcome.ok:
            return [self._shut(outcome.reason_code, "re-authentication failed")]
        self.out += self._auth.succeeded(outcome.auth_data)
        return []

    def _on_connect(self, p: Connect) -> Action:
        self.level = level = p.protocol_level
        self.outbound.level = level
        self._problems.begin(p)
        client_id, refusal = self._handshake.begin(p)
        if refusal:
            if refusal == RC.TOPIC_NAME_INVALID and p.will is not None:
                self._count_will_topic_limit(p.will.topic)
            return self._refuse(refusal)
        self.client_id = client_id
        self.username = p.username or ""
        self.will = p.will
        cfg = self.config
        keepalive_s = enforced_keepalive(p.keepalive_s, level, cfg.max_keepalive_s)
        if keepalive_s != p.keepalive_s:  # a 3.1.1 client held to less than it asked
            self._limit("max_keepalive_s")
        self._keepalive.interval_s = keepalive_s
        if level == 5:
            self.outbound.limit(p.properties, cfg.outbound_topic_alias_maximum)
        self.state = State.AUTHENTICATING
        method = self._auth.method = p.properties.authentication_method
        if method is not None:
            return Authenticate(p, client_id, p.properties.authentication_data or b"")
        return Authenticate(p, client_id)

    def _on_connect_auth(self, p: Auth) -> Action:
        """The client's AUTH answering our challenge during CONNECT: the next step."""
        data = self._auth.answer(p)
        connect = self._handshake.connect
        assert connect is not None, "AUTH answered before CONNECT"
        return Authenticate(connect, self.client_id, data, self._auth.state)

    def _accept(self, outcome: ConnectOutcome, now: float) -> bytes:
        """Take on the session the service granted; the CONNACK to write."""
        self.tenant = outcome.tenant
        self.epoch = outcome.epoch
        self.qos2_fence = outcome.qos2_fence
        self.incarnation = outcome.incarnation
        self.session_expiry_s = outcome.session_expiry_s
        self.persistent = outcome.session_expiry_s > 0 or outcome.session_present
        self.acl = acl = AclChecker(list(outcome.acl), outcome.acl_default_allow)
        self._auth.identity = outcome.identity
        self.state = State.CONNECTED
        self._decoder.max_packet_size = self.config.max_packet_size_bytes
        self._keepalive.last_rx = now
        connack, keepalive_s = self._handshake.connack(outcome, self.client_id)
        if keepalive_s is not None:
            self._keepalive.interval_s = keepalive_s
            asked_s = self._handshake.connect.keepalive_s if self._handshake.connect else 0
            self._limit("max_keepalive_s" if asked_s else "server_keepalive_s")
        hooks = DeliveryHooks(wake=self.on_resume, attach=self._attach_delivery)
        user = outcome.identity.partition("/")[2]
        gate = self._gates(self.tenant, user, hooks) if self._gates else None
        self._inbound.start(
            self.level,
            self.tenant,
            self.client_id,
            acl,
            self.persistent,
            outcome.awaiting_release if outcome.session_present else (),
            gate,
        )
        quota = gate.limits if gate is not None else None
        delivery = gate.delivery if gate is not None else None
        if delivery is not None:
            delivery.refresh()
        self._subscriptions.start(self.level, acl, outcome.subscriptions, quota)
        return encode(connack, self.level)

    def _attach_delivery(self, gate: DeliveryGate | None) -> None:
        """The outbound bandwidth gate while its budgets may limit, None otherwise: a tenant
        without the limit pays nothing per delivery (DeliveryGate.refresh)."""
        self.outbound.gate = gate
