"""CoapGateway: what a CoAP request means, EMQX's CoAP gateway's shape (the aiocoap shell,
coap_server.py, only translates messages to `CoapRequest` and `CoapAnswer` back).

- `POST` or `PUT /ps/{topic}?clientid=..&username=..&password=..[&qos=1][&retain=true]`:
  publish the payload (publishing.py, the same path as HTTP and MQTT); 2.04 Changed once
  kept (QoS >= 1: stored as a PUBACK promises).
- `GET /ps/{filter}` with Observe 0 (`qos` caps the notifications' QoS, 2 by default): an
  observation; the retained messages matching it first, then each message on a matching
  topic, one notification each, confirmable when its QoS (capped) is 1 or more. Cancelling
  the observation (Observe 1, or a reset) ends it.
- `POST /mqtt/connection?clientid=..&username=..&password=..`: connection mode, answered
  2.01 Created with a token that later requests send as `token=` instead of credentials;
  `PUT` the same with `token` keeps it alive (2.04), `DELETE` ends it (2.02).
Bounds: `gateway_coap_messages_per_ip_per_s` per source address (4.29 with Max-Age),
`gateway_max_payload_bytes` (4.13), observations per client and in all (4.29 / 5.03).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from services.common.message import Message
from services.common.mqtt.errors import MqttError
from services.common.topics import is_sys_topic, validate_topic_filter
from services.gateway.address_rate import AddressRate
from services.gateway.coap_clients import ClientRefusedError, CoapClient, CoapClients
from services.gateway.message_input import BadInputError, InputLimits, parse_item
from services.gateway.observing import Observations, Observer
from services.gateway.publishing import Publisher, Publishing, PublishRefusedError

log = logging.getLogger("starling.gateway.coap")


@dataclass(frozen=True, slots=True)
class CoapRequest:
    method: str  # GET, POST, PUT, DELETE
    path: tuple[str, ...]
    query: tuple[str, ...]  # Uri-Query options, `name=value` each
    payload: bytes
    observe: int | None
    address: str


@dataclass(frozen=True, slots=True)
class CoapAnswer:
    status: int  # HTTP-like: 200 (with `created`/`deleted`), 400, 401, ... (coap_server.py maps)
    payload: bytes = b""
    max_age_s: int | None = None
    created: bool = False
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class CoapLimits:
    max_observations: int
    observations_per_client: int


@dataclass(eq=False)
class Observation:
    client: CoapClient
    observer: Observer
    retained: list[Message]  # sent first (retained messages matching the filter)


Retained = Callable[[str, str], Awaitable[list[Message]]]


class CoapGateway:
    def __init__(
        self,
        *,
        clients: CoapClients,
        observations: Observations,
        publishing: Publishing,
        rate: AddressRate,
        input_limits: InputLimits,
        limits: CoapLimits,
        retained: Retained,
    ) -> None:
        """`retained`: the router's retained messages matching a filter (RouterClient)."""
        self._retained = retained
        self._clients = clients
        self._observations = observations
        self._publishing = publishing
        self._rate = rate
        self._input = input_limits
        self._limits = limits

    async def request(self, req: CoapRequest) -> CoapAnswer:
        """A request that is not an observation."""
        wait = self._rate.admit(req.address, time.monotonic())
        if wait is not None:
            return CoapAnswer(429, b"too many requests from this address", max(1, round(wait)))
        query = _query(req.query)
        try:
            if req.path == ("mqtt", "connection"):
                return await self._connection(req, query)
            if len(req.path) < 2 or req.path[0] != "ps":
                return CoapAnswer(404, b"not found: /ps/{topic} or /mqtt/connection")
            if req.method not in ("POST", "PUT"):
                return CoapAnswer(405, b"publish with POST or PUT; GET needs Observe")
            client = await self._clients.identify(query, req.address)
            return await self._publish(client, "/".join(req.path[1:]), query, req.payload)
        except ClientRefusedError as exc:
            return CoapAnswer(exc.status, exc.reason.encode())

    async def observe(self, req: CoapRequest) -> Observation | CoapAnswer:
        """GET with Observe 0: a new observation, or the answer refusing it."""
        wait = self._rate.admit(req.address, time.monotonic())
        if wait is not None:
            return CoapAnswer(429, b"too many requests from this address", max(1, round(wait)))
        if len(req.path) < 2 or req.path[0] != "ps":
            return CoapAnswer(404, b"not found: observe /ps/{topic filter}")
        query = _query(req.query)
        filt = "/".join(req.path[1:])
        try:
            validate_topic_filter(filt)
        except MqttError as exc:
            return CoapAnswer(400, f"invalid topic filter: {exc}".encode())
        if is_sys_topic(filt):
            return CoapAnswer(403, b"$SYS is not observable here")
        qos = query.get("qos", "2")
        if qos not in ("0", "1", "2"):
            return CoapAnswer(400, b"qos must be 0, 1 or 2")
        try:
            client = await self._clients.identify(query, req.address)
        except ClientRefusedError as exc:
            return CoapAnswer(exc.status, exc.reason.encode())
        if not client.acl.can_subscribe(filt):
            return CoapAnswer(403, f"not authorized to observe {filt!r}".encode())
        if len(client.observers) >= self._limits.observations_per_client:
            return CoapAnswer(429, b"too many observations (gateway_coap_observations_per_client)")
        if len(self._observations) >= self._limits.max_observations:
            return CoapAnswer(503, b"too many observations (gateway_coap_max_observations)")
        observer = await self._observations.observe(client.tenant, filt, int(qos))
        observation = Observation(client, observer, await self._retained_of(client, filt))
        client.observers.add(observation)
        return observation

    async def _retained_of(self, client: CoapClient, filt: str) -> list[Message]:
        """Asked after the subscription is in place, so nothing falls between (a message
        retained meanwhile may come twice); the router away: none (logged)."""
        try:
            return await self._retained(client.tenant, filt)
        except Exception as exc:
            log.warning("retained_lookup_failed", extra={"error": type(exc).__name__})
            return []

    async def unobserve(self, observation: Observation) -> None:
        """The observation ended (cancelled by the client, or its client went)."""
        observation.client.observers.discard(observation)
        observation.client.last_seen = time.monotonic()
        await self._observations.forget(observation.observer)

    async def _publish(
        self, client: CoapClient, topic: str, query: dict[str, str], payload: bytes
    ) -> CoapAnswer:
        fields: dict[str, object] = {
            "topic": topic,
            "payload": "",  # checked below as the datagram carried it
            "qos": int(query["qos"]) if query.get("qos", "").isdigit() else query.get("qos", 0),
            "retain": query.get("retain", "false").lower() in ("true", "1"),
        }
        if len(payload) > self._input.max_payload_bytes:
            return CoapAnswer(413, b"payload over gateway_max_payload_bytes")
        try:
            item = parse_item(fields, self._input)
        except BadInputError as exc:
            return CoapAnswer(400, str(exc).encode())
        item = replace(item, payload=payload)
        try:
            await self._publishing.publish(
                Publisher(client.tenant, client.client_id, client.acl), [item]
            )
        except PublishRefusedError as exc:
            return CoapAnswer(exc.status, exc.reason.encode(), max(1, round(exc.retry_after_s)))
        return CoapAnswer(200)

    async def _connection(self, req: CoapRequest, query: dict[str, str]) -> CoapAnswer:
        if req.method == "POST":
            client = await self._clients.identify(_without_token(query), req.address)
            return CoapAnswer(200, client.token.encode(), created=True)
        client = await self._clients.identify(query, req.address)
        if req.method == "PUT":
            return CoapAnswer(200)
        if req.method == "DELETE":
            await self._clients.close(client, normal=True)
            return CoapAnswer(200, deleted=True)
        return CoapAnswer(405, b"POST, PUT or DELETE /mqtt/connection")


def _query(options: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for option in options:
        name, _, value = option.partition("=")
        out[name] = value  # aiocoap has decoded the option already
    return out


def _without_token(query: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in query.items() if k != "token"}
