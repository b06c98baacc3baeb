"""MQTT bridges to another broker (aiomqtt over paho): `mqtt_bridge` is an action publishing
outputs there; `mqtt_bridge_in` is a source subscribing there and publishing what arrives
into the rule's tenant through the republisher.

Connection params (both): `host` (required), `port` (default 1883, 8883 with TLS),
`client_id` (default `starling-<tenant>-<rule_id>[-in]`), `username`, `password`, `tls`
(default false), `ca_file`, `cert_file` + `key_file` (client certificate), `tls_verify`
(default true), `keepalive_s` (default 60), `protocol` (`5` or `3.1.1`, default 5).
Out: `topic` (template, default `${topic}`), `qos` (default the source message's), `retain`.
In: `remote_topic` (filter, required), `qos` (subscription QoS, default 1), `local_topic`
(template over the remote message: `${topic}`, default `${topic}`), `max_queued` (QoS 0
messages buffered before dropping, default 1000).

The bridge in acknowledges a QoS 1/2 message to the remote broker only after the republisher
took it (manual acks; a persistent session), so a stop in between makes the remote broker
send it again; the remote broker's in-flight window bounds what is unacknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from services.common.mqtt.errors import TopicFilterInvalidError, TopicNameInvalidError
from services.common.topics.rules import validate_topic_filter, validate_topic_name
from services.rules.actions.base import ActionContext, Output, PermanentActionError
from services.rules.actions.params import Params
from services.rules.actions.templates import Template

log = logging.getLogger("starling.rules.mqtt_bridge")

RECONNECT_MAX_S = 10.0
IN_FLIGHT = 100  # receive maximum the bridge in asks of the remote broker (MQTT 5)


@dataclass(frozen=True, slots=True)
class Remote:
    host: str
    port: int
    client_id: str
    username: str | None
    password: str | None
    tls: ssl.SSLContext | None
    keepalive_s: int
    protocol: aiomqtt.ProtocolVersion

    def client(self, clean: bool, max_queued: int | None = None) -> aiomqtt.Client:
        v5 = self.protocol == aiomqtt.ProtocolVersion.V5
        props = None
        if v5 and not clean:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 24 * 3600  # keep the remote session across restarts
            props.ReceiveMaximum = IN_FLIGHT
        return aiomqtt.Client(
            self.host,
            self.port,
            identifier=self.client_id,
            username=self.username,
            password=self.password,
            tls_context=self.tls,
            keepalive=self.keepalive_s,
            protocol=self.protocol,
            clean_session=None if v5 else clean,
            clean_start=clean if v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props,
            max_queued_incoming_messages=max_queued,
            timeout=10,
        )


class MqttBridgeOut:
    """Publishes each output to the remote broker; connects on first use and again after a
    failure (the delivery's retries drive reconnection)."""

    def __init__(self, remote: Remote, topic: Template, qos: int | None, retain: bool) -> None:
        self._remote = remote
        self._topic = topic
        self._qos = qos
        self._retain = retain
        self._client: aiomqtt.Client | None = None

    async def start(self) -> None:
        pass  # a remote broker that is down must not stop the rule from loading

    async def _connected(self) -> aiomqtt.Client:
        if self._client is None:
            client = self._remote.client(clean=True)
            await client.__aenter__()
            self._client = client
        return self._client

    async def send(self, outputs: Sequence[Output]) -> None:
        messages = []
        for o in outputs:
            topic = self._topic.render(o)
            try:
                validate_topic_name(topic)
            except TopicNameInvalidError as exc:
                raise PermanentActionError(f"topic: rendered {topic!r}: {exc}") from None
            messages.append((topic, o.payload, o.qos if self._qos is None else self._qos))
        try:
            client = await self._connected()
            # QoS 1/2 publishes return once the remote broker acknowledged them.
            await asyncio.gather(*(client.publish(t, p, q, self._retain) for t, p, q in messages))
        except aiomqtt.MqttError:
            await self._drop()
            raise

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)

    async def close(self) -> None:
        await self._drop()


class MqttBridgeIn:
    """Subscribes on the remote broker and publishes into `ctx.tenant`, reconnecting with
    doubling waits (up to 10 s) while the remote broker is away."""

    def __init__(
        self,
        remote: Remote,
        ctx: ActionContext,
        remote_topic: str,
        qos: int,
        local_topic: Template,
        max_queued: int,
    ) -> None:
        self._remote = remote
        self._ctx = ctx
        self._filter = remote_topic
        self._qos = qos
        self._local = local_topic
        self._max_queued = max_queued
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()  # set while subscribed (tests, health)
        self.received = 0
        self.skipped = 0  # messages whose local topic was not valid

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bridge-in-{self._ctx.rule_id}")

    async def _run(self) -> None:
        wait = 0.1
        while True:
            try:
                client = self._remote.client(clean=False, max_queued=self._max_queued)
                # Acknowledge only after the republisher took the message (see the docstring);
                # aiomqtt does not expose paho's manual acks, so they are set on its client.
                paho = client._client
                paho.manual_ack_set(True)
                async with client:
                    await client.subscribe(self._filter, self._qos)
                    self.connected.set()
                    wait = 0.1
                    async for message in client.messages:
                        await self._forward(message)
                        if message.qos > 0:
                            paho.ack(message.mid, message.qos)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The remote broker went away, or the republisher failed: reconnect, and the
                # remote session sends the unacknowledged messages again.
                self.connected.clear()
                log.warning(
                    "bridge_in_disconnected",
                    extra={"rule_id": self._ctx.rule_id, "error": str(exc)[:200]},
                )
                await asyncio.sleep(wait)
                wait = min(wait * 2, RECONNECT_MAX_S)

    async def _forward(self, message: aiomqtt.Message) -> None:
        payload = message.payload
        body = payload if isinstance(payload, bytes) else str(payload or "").encode()
        source = Output(
            tenant=self._ctx.tenant,
            rule_id=self._ctx.rule_id,
            topic=message.topic.value,
            columns={},
            payload=body,
            qos=message.qos,
            message_id=str(message.mid),
            published_at_ms=0,
        )
        try:
            topic = self._local.render(source)
            validate_topic_name(topic)
            if topic.startswith("$"):
                raise TopicNameInvalidError("a $ topic")
        except (PermanentActionError, TopicNameInvalidError) as exc:
            self.skipped += 1
            log.warning("bridge_in_skipped", extra={"topic": source.topic, "error": str(exc)})
            return
        props = getattr(message.properties, "UserProperty", None) or []
        await self._ctx.republisher.publish(
            self._ctx.tenant, topic, body, message.qos, False, tuple(props)
        )
        self.received += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.connected.clear()


def _remote(p: Params, ctx: ActionContext, suffix: str) -> Remote:
    host = p.text("host")
    use_tls = p.flag("tls", False)
    port = p.integer("port", 8883 if use_tls else 1883, 1, 65535)
    client_id = p.text("client_id", f"starling-{ctx.tenant}-{ctx.rule_id}{suffix}")
    password = p.opt("password")
    username = p.opt("username")
    if password and not username:
        raise ValueError("password: needs a username")
    ca_file, cert_file, key_file = p.file("ca_file"), p.file("cert_file"), p.file("key_file")
    verify = p.flag("tls_verify", True)
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file: cert_file and key_file go together")
    ctx_tls = None
    if use_tls:
        ctx_tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
        if cert_file and key_file:
            ctx_tls.load_cert_chain(str(cert_file), str(key_file))
        if not verify:
            ctx_tls.check_hostname = False
            ctx_tls.verify_mode = ssl.CERT_NONE
    elif ca_file or cert_file:
        raise ValueError("tls: ca_file/cert_file need tls=true")
    protocol = p.choice("protocol", "5", ("5", "3.1.1"))
    return Remote(
        host,
        port,
        client_id,
        username,
        password,
        ctx_tls,
        p.integer("keepalive_s", 60, 5, 65535),
        aiomqtt.ProtocolVersion.V5 if protocol == "5" else aiomqtt.ProtocolVersion.V311,
    )


def build(p: Params, ctx: ActionContext) -> MqttBridgeOut:
    remote = _remote(p, ctx, "")
    topic = Template(p.text("topic", "${topic}"), "topic")
    qos = None if p.opt("qos") is None else p.integer("qos", 0, 0, 2)
    return MqttBridgeOut(remote, topic, qos, p.flag("retain", False))


def build_source(p: Params, ctx: ActionContext) -> MqttBridgeIn:
    remote = _remote(p, ctx, "-in")
    remote_topic = p.text("remote_topic")
    try:
        validate_topic_filter(remote_topic)
    except TopicFilterInvalidError as exc:
        raise ValueError(f"remote_topic: {exc}") from None
    local = Template(p.text("local_topic", "${topic}"), "local_topic")
    qos = p.integer("qos", 1, 0, 2)
    max_queued = p.integer("max_queued", 1000, 1, 1_000_000)
    return MqttBridgeIn(remote, ctx, remote_topic, qos, local, max_queued)
